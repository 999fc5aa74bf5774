/**
 * delete-messages - contract section 3's message deletions that do not wait for the inbox's expiry:
 * - downloaded: DOWNLOAD_GRACE_SECONDS after the download (reason `downloaded`);
 * - listed and never downloaded: UNCLAIMED_SECONDS after the first listing (reason `unclaimed`);
 * both when delete_after has passed, with deleted_at = delete_after, and their chunks are freed. Readers
 * already stopped listing and counting them at delete_after, so no version is bumped.
 * - a stored copy found missing: reason `lost`, logged as an error (it should not happen). Each run
 *   checks the next `scanPages` pages of stored messages, going round the table from where the last run
 *   of this process stopped; the check costs no content read (a chunk's TOAST pointer holds its size).
 *   This changes what a poll lists, so recordLost bumps the inbox's version.
 */
import type { MessageKey } from '../core/ports.ts';
import { isLostCopy } from '../core/retention.ts';
import { defineJob, type Job, type JobDeps } from './job.ts';

export function deleteMessages(deps: JobDeps): Job {
  let cursor: MessageKey | null = null;
  return defineJob('delete-messages', deps, async (run) => {
    await run.repeat(async () => {
      const freed = await deps.store.deleteDueMessages(run.now, {
        rows: run.limits.batchRows,
        bytes: run.limits.batchBytes,
      });
      run.add({ downloaded: freed.downloaded, unclaimed: freed.unclaimed, bytes: freed.bytes });
      return freed.messages > 0;
    });

    let pages = 0;
    await run.repeat(async () => {
      const copies = await deps.store.storedCopies(cursor, run.limits.batchRows);
      run.add({ checked: copies.length, lost: 0 });
      for (const copy of copies) {
        if (!isLostCopy(copy)) continue;
        deps.log({
          level: 'error',
          msg: 'stored copy missing; message deleted as lost',
          job: 'delete-messages',
          inbox_id: copy.inboxId,
          message_id: copy.messageId,
          size_bytes: copy.sizeBytes,
          stored_bytes: copy.storedBytes,
        });
        if (await deps.store.recordLost(copy, run.now)) run.add({ lost: 1 });
      }
      const last = copies.at(-1);
      cursor =
        copies.length === run.limits.batchRows && last
          ? { inboxId: last.inboxId, messageId: last.messageId }
          : null;
      return cursor !== null && ++pages < run.limits.scanPages;
    });
  });
}
