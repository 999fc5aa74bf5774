/**
 * usage - which messages count in an inbox's quota_used_bytes and message_count at an instant:
 * reserved by then (in flight, stored, downloaded) and not yet deleted then, by a recorded deletion
 * or by delete_after. Expired inboxes are counted at expires_at ("status keeps final counts").
 */
export const USAGE_WHERE = (inboxId: string, asOf: string): string => `
  inbox_id = ${inboxId} AND reserved_at <= ${asOf}
  AND (deleted_at IS NULL OR deleted_at > ${asOf})
  AND (delete_after IS NULL OR delete_after > ${asOf})`;
