/**
 * openapi - the OpenAPI 3.1 document, built from the same TypeBox schemas the routes validate with.
 * Served at GET /v1/openapi.json; the test suite checks every response it sees against it.
 */
import * as S from './schemas.ts';

const json = (schema: unknown) => ({ 'application/json': { schema } });
const error = (description: string) => ({
  description,
  content: json({ $ref: '#/components/schemas/Error' }),
});
const ok = (description: string, schema: unknown, headers?: Record<string, unknown>) => ({
  description,
  content: json(schema),
  ...(headers ? { headers } : {}),
});
const ref = (name: string) => ({ $ref: `#/components/schemas/${name}` });
const header = (description: string, schema: unknown = { type: 'string' }) => ({ description, schema });

const inboxIdParam = { name: 'id', in: 'path', required: true, schema: S.InboxId };
const bearer = [{ bearer: [] }];
const replayed = {
  'Idempotent-Replayed': header('`true` when this is the stored response for the Idempotency-Key'),
};
const idempotencyKey = {
  name: 'Idempotency-Key',
  in: 'header',
  required: false,
  schema: { type: 'string', pattern: '^[\\x21-\\x7e]{1,255}$' },
};
const rateLimited = {
  description: 'rate limited',
  headers: { 'Retry-After': header('seconds, equal to details.retry_after_seconds', { type: 'integer' }) },
  content: json(ref('Error')),
};
const common = {
  '401': error('missing, malformed or unknown credential, or not this inbox'),
  '410': error('inbox_cancelled'),
  '500': error('internal'),
};
const downloadHeaders = {
  'Content-Length': header('bytes in the body', { type: 'integer' }),
  ETag: header('strong validator of the message content'),
  'Accept-Ranges': header('always `bytes`'),
  'Cache-Control': header('always `no-store`'),
};
const rawMessage = { 'message/rfc822': { schema: { type: 'string', contentMediaType: 'message/rfc822' } } };

export function openApiDocument() {
  return {
    openapi: '3.1.0',
    info: {
      title: 'Agent inbox API',
      version: 'v1',
      description: 'Receive-only, short-lived email inboxes for software agents.',
    },
    components: {
      securitySchemes: {
        bearer: { type: 'http', scheme: 'bearer', description: 'owner (rmo_...) or reader (rmr_...)' },
      },
      schemas: {
        InboxStatus: S.InboxStatus,
        ProvisionedInbox: S.ProvisionedInbox,
        MessageSummary: S.MessageSummary,
        RejectionEvent: S.RejectionEvent,
        PollResponse: S.PollResponse,
        Health: S.Health,
        Error: S.ErrorBody,
        ProvisionRequest: S.ProvisionRequest,
        SenderDomainsRequest: S.SenderDomainsRequest,
        ExtendRequest: S.ExtendRequest,
      },
    },
    paths: {
      '/v1/health': {
        get: {
          operationId: 'health',
          responses: { '200': ok('service is up', ref('Health')), '500': error('internal') },
        },
        head: {
          operationId: 'healthHead',
          responses: {
            '200': { description: "health's headers, no body" },
            '500': { description: 'internal' },
          },
        },
      },
      '/v1/openapi.json': {
        get: { operationId: 'openapi', responses: { '200': ok('this document', { type: 'object' }) } },
        head: {
          operationId: 'openapiHead',
          responses: { '200': { description: "this document's headers" } },
        },
      },
      '/v1/inboxes': {
        post: {
          operationId: 'provision',
          parameters: [idempotencyKey],
          requestBody: { required: true, content: json(ref('ProvisionRequest')) },
          responses: {
            '201': ok(
              'the provisioned inbox; credentials are shown only here',
              ref('ProvisionedInbox'),
              replayed,
            ),
            '400': error('invalid_request or out_of_bounds'),
            '401': error('unauthorized: provisioning is closed'),
            '409': error('idempotency_conflict or sender_opted_out'),
            '500': error('internal'),
          },
        },
      },
      '/v1/inboxes/{id}': {
        get: {
          operationId: 'status',
          security: bearer,
          parameters: [inboxIdParam],
          responses: {
            '200': ok('inbox status', ref('InboxStatus')),
            '400': error('invalid_request'),
            '429': rateLimited,
            ...common,
          },
        },
        head: {
          operationId: 'statusHead',
          security: bearer,
          parameters: [inboxIdParam],
          responses: {
            '200': {
              description: "the status answer's headers, no body; counts against the status rate limit",
            },
            '400': { description: 'invalid_request' },
            '401': { description: 'unauthorized' },
            '410': { description: 'inbox_cancelled' },
            '429': { description: 'rate_limited' },
            '500': { description: 'internal' },
          },
        },
      },
      '/v1/inboxes/{id}/messages': {
        get: {
          operationId: 'poll',
          security: bearer,
          parameters: [
            inboxIdParam,
            { name: 'cursor', in: 'query', required: false, schema: S.Cursor },
            { name: 'limit', in: 'query', required: false, schema: S.PollQuery.properties.limit },
          ],
          responses: {
            '200': ok('new messages and rejections', ref('PollResponse'), {
              'Cache-Control': header('always `no-store`'),
            }),
            '400': error('invalid_request (cursor) or out_of_bounds (limit)'),
            '429': rateLimited,
            ...common,
          },
        },
      },
      '/v1/inboxes/{id}/messages/{msg_id}': {
        get: {
          operationId: 'download',
          security: bearer,
          parameters: [
            inboxIdParam,
            { name: 'msg_id', in: 'path', required: true, schema: S.MessageId },
            { name: 'Range', in: 'header', required: false, schema: { type: 'string' } },
          ],
          responses: {
            '200': {
              description: 'the raw message as received',
              headers: downloadHeaders,
              content: rawMessage,
            },
            '206': {
              description: 'the requested byte range',
              headers: { ...downloadHeaders, 'Content-Range': header('bytes a-b/size') },
              content: rawMessage,
            },
            '400': error('invalid_request'),
            '404': error('message_not_found'),
            '410': error('message_gone or inbox_cancelled'),
            '416': {
              description: 'range_not_satisfiable',
              headers: { 'Content-Range': header('bytes */size') },
              content: json(ref('Error')),
            },
            '429': rateLimited,
            '401': common['401'],
            '500': common['500'],
          },
        },
        head: {
          operationId: 'inspect',
          security: bearer,
          parameters: [
            inboxIdParam,
            { name: 'msg_id', in: 'path', required: true, schema: S.MessageId },
            { name: 'Range', in: 'header', required: false, schema: { type: 'string' } },
          ],
          responses: {
            '200': {
              description:
                'the download headers, no body; does not start the deletion timer. With a satisfiable Range the status stays 200, with the range as Content-Length and Content-Range',
              headers: { ...downloadHeaders, 'Content-Range': header('with a Range header: bytes a-b/size') },
            },
            '400': { description: 'invalid_request' },
            '401': { description: 'unauthorized' },
            '404': { description: 'message_not_found' },
            '410': { description: 'message_gone or inbox_cancelled' },
            '416': { description: 'range_not_satisfiable' },
            '429': { description: 'rate_limited' },
            '500': { description: 'internal' },
          },
        },
      },
      '/v1/inboxes/{id}/extend': {
        post: {
          operationId: 'extend',
          security: bearer,
          parameters: [inboxIdParam, idempotencyKey],
          requestBody: { required: false, content: json(ref('ExtendRequest')) },
          responses: {
            '200': ok('inbox status with the new expires_at', ref('InboxStatus'), replayed),
            '400': error('invalid_request'),
            '403': error('forbidden: reader credential'),
            '409': error('inbox_expired or idempotency_conflict'),
            ...common,
          },
        },
      },
      '/v1/inboxes/{id}/sender-domains': {
        put: {
          operationId: 'setSenderDomains',
          security: bearer,
          parameters: [inboxIdParam],
          requestBody: { required: true, content: json(ref('SenderDomainsRequest')) },
          responses: {
            '200': ok('inbox status with the new list', ref('InboxStatus')),
            '400': error('invalid_request or out_of_bounds'),
            '403': error('forbidden: reader credential'),
            '409': error('inbox_expired or sender_opted_out'),
            '429': rateLimited,
            ...common,
          },
        },
      },
    },
  };
}
