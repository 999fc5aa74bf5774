/**
 * clock - a clock the test moves by hand (the only fake besides DNS, STYLE 18).
 */
import type { Clock } from '../../src/core/clock.ts';

export class FakeClock implements Clock {
  #ms: number;

  constructor(start: Date = new Date()) {
    this.#ms = start.getTime();
  }

  now(): Date {
    return new Date(this.#ms);
  }

  advance(seconds: number): void {
    this.#ms += seconds * 1000;
  }
}
