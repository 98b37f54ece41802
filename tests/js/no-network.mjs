// Loaded with `node --import ./no-network.mjs`: any connection beyond loopback is refused and
// reported on stderr ("NETWORK: host"), which fails the test that ran the script. The clients
// under test must talk to the gateway only; nothing may phone home (telemetry, model lists).
import net from "node:net";

const original = net.Socket.prototype.connect;

function loopback(host) {
  if (host === undefined || host === null || host === "" || host === "localhost") return true;
  const name = String(host).replace(/^\[|\]$/g, "");
  return name === "::1" || name.startsWith("127.") || name.startsWith("::ffff:127.");
}

net.Socket.prototype.connect = function connect(...args) {
  let options = args[0];
  if (Array.isArray(options)) options = options[0]; // node's own normalized arguments
  let host;
  if (options !== null && typeof options === "object") {
    if (options.path) return original.apply(this, args); // a Unix socket
    host = options.host;
  } else if (typeof options === "number" || /^\d+$/.test(String(options))) {
    host = typeof args[1] === "string" ? args[1] : undefined;
  } else {
    return original.apply(this, args); // a Unix socket path
  }
  if (!loopback(host)) {
    process.stderr.write(`NETWORK: ${host}\n`);
    const error = new Error(`no network in tests/js: ${host}`);
    process.nextTick(() => this.destroy(error));
    return this;
  }
  return original.apply(this, args);
};
