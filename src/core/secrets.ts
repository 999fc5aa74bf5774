/**
 * secrets - credential hashes and the sealed provision replay (DESIGN decision 10).
 *
 * Credentials are stored only as SHA-256. An Idempotency-Key is looked up by HMAC(secret, key), and the
 * provision response stored under it (it holds both credentials) is sealed with AES-256-GCM under a
 * key derived from the Idempotency-Key itself plus the server secret: a database dump alone, or the
 * secret alone, opens nothing.
 */
import { createCipheriv, createDecipheriv, createHash, createHmac, hkdfSync, randomBytes } from 'node:crypto';

export const hashCredential = (credential: string): Buffer =>
  createHash('sha256').update(credential, 'utf8').digest();

export class Secrets {
  readonly #secret: Buffer;

  constructor(secretKey: string) {
    if (secretKey.length < 32) throw new Error('SECRET_KEY must be at least 32 characters');
    this.#secret = Buffer.from(secretKey, 'utf8');
  }

  /** Lookup key for an Idempotency-Key within a scope ("provision", or an inbox id for extend). */
  idempotencyKeyHash(scope: string, key: string): Buffer {
    return createHmac('sha256', this.#secret).update(`idempotency\0${scope}\0${key}`, 'utf8').digest();
  }

  /** Hash of a normalized request, to tell a replay from a conflicting reuse of a key. */
  requestHash(request: unknown): Buffer {
    return createHmac('sha256', this.#secret)
      .update(`request\0${JSON.stringify(request)}`, 'utf8')
      .digest();
  }

  seal(key: string, plaintext: string): Buffer {
    const iv = randomBytes(12);
    const cipher = createCipheriv('aes-256-gcm', this.#sealKey(key), iv);
    const body = Buffer.concat([cipher.update(plaintext, 'utf8'), cipher.final()]);
    return Buffer.concat([iv, cipher.getAuthTag(), body]);
  }

  /** Throws when the sealed value was not sealed under this key and secret. */
  open(key: string, sealed: Buffer): string {
    const decipher = createDecipheriv('aes-256-gcm', this.#sealKey(key), sealed.subarray(0, 12));
    decipher.setAuthTag(sealed.subarray(12, 28));
    return Buffer.concat([decipher.update(sealed.subarray(28)), decipher.final()]).toString('utf8');
  }

  #sealKey(key: string): Buffer {
    return Buffer.from(hkdfSync('sha256', Buffer.from(key, 'utf8'), this.#secret, 'provision-replay', 32));
  }
}
