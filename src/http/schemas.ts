/**
 * schemas - one TypeBox schema per request part and per response (STYLE 8). They validate requests,
 * give the static types, and are the OpenAPI document's components (openapi.ts).
 */
import Type from 'typebox';

const DateTime = Type.String({ format: 'date-time' });
const Id = (pattern: string, description: string) => Type.String({ pattern, description });
const ID_CHARS = '[0-9a-hjkmnp-tv-z]';

export const InboxId = Id(`^${ID_CHARS}{20}$`, '20 characters of lowercase Crockford base32');
export const MessageId = Id(
  `^msg_${ID_CHARS}{20}$`,
  '`msg_` and 20 characters of lowercase Crockford base32',
);
export const Cursor = Type.String({
  pattern: '^1\\.[0-9a-z]{1,11}$',
  description: 'a position issued by the service',
});
export const SenderDomainList = Type.Array(Type.String({ minLength: 1, maxLength: 254 }), {
  maxItems: 20,
  description: 'domain names; stored lowercased, deduplicated and sorted',
});

const Verdict = Type.Object(
  { result: Type.String(), domain: Type.Union([Type.String(), Type.Null()]) },
  { additionalProperties: false },
);

export const InboxStatus = Type.Object(
  {
    inbox_id: InboxId,
    address: Type.String(),
    state: Type.Union([Type.Literal('live'), Type.Literal('expired')]),
    created_at: DateTime,
    expires_at: DateTime,
    quota_bytes: Type.Integer({ minimum: 0 }),
    quota_used_bytes: Type.Integer({ minimum: 0 }),
    message_count: Type.Integer({ minimum: 0 }),
    rejection_count: Type.Integer({ minimum: 0 }),
    sender_domains: Type.Array(Type.String()),
  },
  { additionalProperties: false },
);

export const ProvisionedInbox = Type.Object(
  {
    inbox_id: InboxId,
    address: Type.String(),
    created_at: DateTime,
    expires_at: DateTime,
    quota_bytes: Type.Integer({ minimum: 0 }),
    sender_domains: Type.Array(Type.String()),
    credentials: Type.Object(
      {
        owner: Type.String({ pattern: `^rmo_${ID_CHARS}{32}$` }),
        reader: Type.String({ pattern: `^rmr_${ID_CHARS}{32}$` }),
      },
      { additionalProperties: false },
    ),
  },
  { additionalProperties: false },
);

export const MessageSummary = Type.Object(
  {
    message_id: MessageId,
    url: Type.String({ format: 'uri' }),
    from: Type.Object(
      { name: Type.Union([Type.String(), Type.Null()]), address: Type.Union([Type.String(), Type.Null()]) },
      { additionalProperties: false },
    ),
    envelope_from: Type.String(),
    subject: Type.Union([Type.String(), Type.Null()]),
    size_bytes: Type.Integer({ minimum: 0 }),
    received_at: DateTime,
    downloaded_at: Type.Union([DateTime, Type.Null()]),
    delete_after: DateTime,
    internet_message_id: Type.Union([Type.String(), Type.Null()]),
    authentication: Type.Union([
      Type.Object({ dmarc: Verdict, dkim: Verdict, spf: Verdict }, { additionalProperties: false }),
      Type.Null(),
    ]),
  },
  { additionalProperties: false },
);

export const RejectionEvent = Type.Object(
  {
    at: DateTime,
    envelope_from: Type.String(),
    reason: Type.String({
      description: '`quota`, `sender_not_allowed` or `sender_opted_out`; new reasons may be added',
    }),
    sender_domain: Type.Union([Type.String(), Type.Null()]),
    size_bytes: Type.Integer({ minimum: 0 }),
  },
  { additionalProperties: false },
);

export const PollResponse = Type.Object(
  {
    inbox: InboxStatus,
    server_time: DateTime,
    messages: Type.Array(MessageSummary),
    rejections: Type.Array(RejectionEvent),
    next_cursor: Cursor,
    next_url: Type.String({ format: 'uri' }),
    has_more: Type.Boolean(),
  },
  { additionalProperties: false },
);

export const Health = Type.Object(
  { ok: Type.Literal(true), environment: Type.Union([Type.Literal('dev'), Type.Literal('prod')]) },
  { additionalProperties: false },
);

export const ErrorBody = Type.Object(
  {
    error: Type.Object(
      {
        code: Type.String({ description: 'stable snake_case identifier (contract section 7)' }),
        message: Type.String(),
        details: Type.Optional(Type.Record(Type.String(), Type.Unknown())),
      },
      { additionalProperties: false },
    ),
  },
  { additionalProperties: false },
);

// Requests. Unknown fields are refused with details.field naming them (contract section 1).
export const ProvisionRequest = Type.Object(
  { sender_domains: Type.Optional(SenderDomainList) },
  { additionalProperties: false },
);
export const SenderDomainsRequest = Type.Object(
  { sender_domains: SenderDomainList },
  { additionalProperties: false },
);
export const ExtendRequest = Type.Object({}, { additionalProperties: false });
export const PollQuery = Type.Object(
  {
    cursor: Type.Optional(Cursor),
    limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 200, default: 50 })),
  },
  { additionalProperties: false },
);
