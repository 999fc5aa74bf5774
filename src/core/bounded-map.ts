/**
 * bounded-map - a Map that holds at most `max` entries, dropping the oldest-set one first. The
 * per-process caches (usage-cache.ts, storage/recipient-lookup.ts) keep their memory bounded with it;
 * poll-cache.ts, whose pages vary in size, counts bytes itself.
 */
export class BoundedMap<K, V> {
  readonly #entries = new Map<K, V>();
  readonly #max: number;

  constructor(max: number) {
    this.#max = max;
  }

  get(key: K): V | undefined {
    return this.#entries.get(key);
  }

  delete(key: K): void {
    this.#entries.delete(key);
  }

  clear(): void {
    this.#entries.clear();
  }

  set(key: K, value: V): void {
    if (this.#max === 0) return;
    this.#entries.delete(key);
    if (this.#entries.size >= this.#max) {
      const oldest = this.#entries.keys().next().value;
      if (oldest !== undefined) this.#entries.delete(oldest);
    }
    this.#entries.set(key, value);
  }
}
