/**
 * openapi-validator - checks a response against the OpenAPI document the service serves: the status
 * must be documented for the operation, and a JSON body must match that status's schema.
 */

import type { ValidateFunction } from 'ajv';
import { Ajv2020 } from 'ajv/dist/2020.js';
import addFormatsModule from 'ajv-formats';

// ajv-formats is CommonJS; its default export arrives wrapped under ESM.
const addFormats = ((addFormatsModule as unknown as { default?: unknown }).default ?? addFormatsModule) as (
  ajv: Ajv2020,
) => void;

interface Operation {
  responses: Record<string, { content?: Record<string, { schema?: unknown }> }>;
}
type Document = {
  paths: Record<string, Record<string, Operation>>;
  components: { schemas: Record<string, unknown> };
};

export class OpenApiValidator {
  readonly #document: Document;
  readonly #ajv: Ajv2020;
  readonly #compiled = new Map<string, ValidateFunction>();
  readonly #routes: { pattern: RegExp; template: string }[];

  constructor(document: unknown) {
    this.#document = document as Document;
    this.#ajv = new Ajv2020({ strict: false, allErrors: true });
    addFormats(this.#ajv);
    this.#ajv.addSchema({ $id: 'doc', components: this.#document.components });
    this.#routes = Object.keys(this.#document.paths).map((template) => ({
      template,
      pattern: new RegExp(`^${template.replace(/\{[^}]+\}/g, '[^/]+').replace(/\./g, '\\.')}$`),
    }));
  }

  /** Returns a list of problems; empty when the response conforms. */
  check(method: string, path: string, status: number, contentType: string | null, body: string): string[] {
    // A 404 for what no endpoint serves carries the error body, except to HEAD, which has no body.
    const notFound = () => (method === 'HEAD' ? [] : this.#checkError(body));
    const route = this.#routes.find((r) => r.pattern.test(path));
    if (!route) return status === 404 ? notFound() : [`${method} ${path}: no path in the document`];
    const operation = this.#document.paths[route.template]?.[method.toLowerCase()];
    if (!operation) return status === 404 ? notFound() : [`${method} ${route.template}: not documented`];
    const response = operation.responses[String(status)];
    if (!response) return [`${method} ${route.template}: status ${status} not documented`];
    if (method === 'HEAD' || !contentType?.startsWith('application/json')) return [];
    const schema = response.content?.['application/json']?.schema;
    if (!schema) return [`${method} ${route.template} ${status}: JSON body but no JSON schema documented`];
    return this.#validate(`${method} ${route.template} ${status}`, schema, body);
  }

  #checkError(body: string): string[] {
    return this.#validate('404', { $ref: '#/components/schemas/Error' }, body);
  }

  #validate(key: string, schema: unknown, body: string): string[] {
    let validate = this.#compiled.get(key);
    if (!validate) {
      validate = this.#ajv.compile(rewriteRefs(schema) as object);
      this.#compiled.set(key, validate);
    }
    let value: unknown;
    try {
      value = JSON.parse(body);
    } catch {
      return [`${key}: body is not JSON`];
    }
    if (validate(value)) return [];
    return (validate.errors ?? []).map((e) => `${key}: ${e.instancePath} ${e.message}`);
  }
}

/** Local `#/components/...` refs point into the document registered as `doc`. */
function rewriteRefs(schema: unknown): unknown {
  return JSON.parse(JSON.stringify(schema), (k, v) =>
    k === '$ref' && typeof v === 'string' && v.startsWith('#/') ? `doc${v}` : v,
  );
}
