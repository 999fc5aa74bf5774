/**
 * copy-binary - reads the rows of a single-column `COPY ... TO STDOUT (FORMAT binary)` result.
 *
 * Chunk reads use COPY because node-postgres decodes every DataRow field as UTF-8 text: a bytea would
 * come back as hex (twice the bytes, encoded by Postgres and decoded again here) and per-query binary
 * results corrupt bytes >= 0x80. COPY's binary format carries the bytes as they are (PostgreSQL
 * manual, "COPY", section "Binary Format"): an 11-byte signature, a 32-bit flags field, a 32-bit
 * header-extension length and the extension; then per tuple a 16-bit field count (-1 ends the data)
 * and, per field, a 32-bit length (-1 for NULL) and that many bytes.
 */
export const COPY_SIGNATURE = Buffer.from('PGCOPY\n\xff\r\n\0', 'latin1');

/** The single field of each tuple, as zero-copy views into `data`. Throws on anything malformed. */
export function parseBinaryCopy(data: Buffer): Buffer[] {
  if (data.length < 19 || !data.subarray(0, 11).equals(COPY_SIGNATURE))
    throw new Error('not a binary COPY stream');
  let offset = 15;
  offset += 4 + data.readUInt32BE(offset);
  const rows: Buffer[] = [];
  for (;;) {
    if (offset + 2 > data.length) throw new Error('binary COPY stream ends without its trailer');
    const fields = data.readInt16BE(offset);
    offset += 2;
    if (fields === -1) return rows;
    if (fields !== 1) throw new Error(`expected one field per tuple, got ${fields}`);
    const length = data.readInt32BE(offset);
    offset += 4;
    if (length < 0 || offset + length > data.length)
      throw new Error('binary COPY field is NULL or truncated');
    rows.push(data.subarray(offset, offset + length));
    offset += length;
  }
}
