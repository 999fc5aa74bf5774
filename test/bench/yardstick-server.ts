/**
 * yardstick-server - the benchmark's reference point: a bare Koa server answering every request with
 * one `SELECT 1` on the same Postgres. Its pool is twice the API's default (20, not 10): the
 * yardstick is not held back by its pool, so the ratios are not flattered by a weak reference.
 */
import Koa from 'koa';
import pg from 'pg';

const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL, max: 20 });
const app = new Koa();
app.use(async (ctx) => {
  const result = await pool.query({ name: 'one', text: 'SELECT 1 AS one' });
  ctx.body = { one: result.rows[0].one };
});
app.listen(Number(process.env.PORT), '127.0.0.1', () => process.stdout.write('listening\n'));
