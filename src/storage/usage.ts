/**
 * usage - which messages count in an inbox's quota_used_bytes and message_count at an instant:
 * reserved by then (in flight, stored, downloaded) and not yet deleted then, by a recorded deletion
 * or by delete_after. Expired inboxes are counted at expires_at ("status keeps final counts"). The rule
 * itself is the SQL function counts_in_usage (migrations/20261123000000_delivery_functions.ts), which
 * the milter's reservation reads too; the planner inlines it.
 */
export const USAGE_WHERE = (inboxId: string, asOf: string): string => `
  inbox_id = ${inboxId} AND counts_in_usage(reserved_at, deleted_at, delete_after, ${asOf})`;
