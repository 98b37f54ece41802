// What every script shares: where the gateway is, and how a result is handed back.
export const GATEWAY_URL = process.env.GATEWAY_URL; // http://127.0.0.1:PORT, no trailing slash
export const GATEWAY_KEY = process.env.GATEWAY_KEY ?? "unused";
export const MODEL = process.env.MODEL ?? "fake";
export const BASE_URL = `${GATEWAY_URL}/v1`;

if (!GATEWAY_URL) throw new Error("GATEWAY_URL is not set");

/** Print the script's result: one line of JSON that test_js_clients.py reads. */
export function emit(result) {
  process.stdout.write(`RESULT ${JSON.stringify(result)}\n`);
}

/** Run `main`, emit what it returns; an error is printed and the exit status is 1. */
export async function run(main) {
  try {
    emit(await main());
  } catch (error) {
    process.stderr.write(`${error?.stack ?? error}\n`);
    process.exitCode = 1;
  }
}
