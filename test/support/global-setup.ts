/**
 * global-setup - `node --test --test-global-setup=test/support/global-setup.ts`: migrates the
 * template database once before any test file runs.
 */
import { prepareTemplate } from './database.ts';

export async function globalSetup(): Promise<void> {
  await prepareTemplate();
}
