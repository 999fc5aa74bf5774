/**
 * usage - which messages count in an inbox's quota_used_bytes and message_count at an instant:
 * reserved by then (in flight, stored, downloaded) and not yet deleted then, by a recorded deletion
 * or by delete_after. Expired inboxes are counted at expires_at ("status keeps final counts"). The rule
 * itself is the SQL function counts_in_usage (migrations/20261123000000_delivery_functions.ts); the planner
 * inlines it. The mail path (the policy daemon's SIZE= check, the milter's reservation) reads the same
 * usage at the present instant from the inbox's counter instead: inbox_used_bytes
 * (migrations/20261125000000_held_bytes.ts).
 */
export const USAGE_WHERE = (inboxId: string, asOf: string): string => `
  inbox_id = ${inboxId} AND counts_in_usage(reserved_at, deleted_at, delete_after, ${asOf})`;
