// What the attack pages share: the controller's loopback addresses, and the two ways a page reaches them
// (a no-cors fetch, which needs no CORS consent to send, and a WebSocket). Each answers what it saw.
const hosts = ["127.0.0.1", "localhost", "[::1]"];

async function send(host, body) {
  try {
    await fetch(`http://${host}:8765/v1/actions`, {
      mode: "no-cors", method: "POST", headers: {"Content-Type": "text/plain"}, body,
    });
    return "sent";
  } catch (error) {
    return "failed";
  }
}

function socket(host, bodies, timeoutMs) {
  return new Promise((resolve) => {
    let ws;
    try {
      ws = new WebSocket(`ws://${host}:8765/v1/ws`);
    } catch (error) {
      resolve("threw");
      return;
    }
    const timer = setTimeout(() => { resolve("timeout"); ws.close(); }, timeoutMs);
    ws.onopen = () => { for (const body of bodies) ws.send(body); };
    ws.onmessage = (message) => { clearTimeout(timer); resolve("message " + String(message.data).slice(0, 300)); };
    ws.onerror = () => { clearTimeout(timer); resolve("error"); };
  });
}
