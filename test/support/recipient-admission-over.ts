/**
 * recipient-admission-over - the policy daemon's RecipientAdmission over a test harness, with its
 * lookup or message store replaced (a lookup that listens, one that fails; a store that records slowly).
 */
import { TOKENS } from '../../src/container.ts';
import type { MessageStore, RecipientLookup, ReverseDns } from '../../src/core/ports.ts';
import { RecipientAdmission } from '../../src/core/recipient-admission.ts';
import type { SmtpReplies } from '../../src/core/smtp-replies.ts';
import type { Harness } from './harness.ts';

export function recipientAdmissionOver(
  h: Harness,
  options: { lookup?: RecipientLookup; messages?: MessageStore } = {},
): RecipientAdmission {
  return new RecipientAdmission(
    h.inboxes,
    options.lookup ?? h.container.resolve<RecipientLookup>(TOKENS.RecipientLookup),
    options.messages ?? h.messages,
    h.container.resolve<ReverseDns>(TOKENS.ReverseDns),
    h.clock,
    h.container.resolve<SmtpReplies>(TOKENS.SmtpReplies),
    h.config,
  );
}
