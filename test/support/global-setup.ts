/**
 * global-setup - `node --test --test-global-setup=test/support/global-setup.ts`: migrates one template
 * database for this run before any test file starts (each file clones it), and drops it at the end.
 * The name is unique per run, so runs side by side never disturb each other.
 */
import { randomBytes } from 'node:crypto';
import { dropDatabase, recreateDatabase } from './database.ts';

const name = `inbox_test_template_${randomBytes(4).toString('hex')}`;

export async function globalSetup(): Promise<void> {
  process.env.INBOX_TEST_TEMPLATE = name;
  await recreateDatabase(name);
}

export async function globalTeardown(): Promise<void> {
  await dropDatabase(name);
}
