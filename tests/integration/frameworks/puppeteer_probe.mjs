// Puppeteer (puppeteer-core: it launches no browser) against Corral's CDP endpoint: connect with
// browserURL (or browserWSEndpoint) and the session token as a header, open the page in the
// session's Chromium, read it, print what it read as one JSON line, and disconnect (the browser stays).
// With "close" last, it instead closes what it opened, then every page left (the last of them
// too), then the browser, and prints how long each step took (a step that never returns is
// reported after STEP_LIMIT_MS rather than left hanging).
// Run by tests/integration/test_cdp_frameworks.py:
//   node puppeteer_probe.mjs <cdp url> <session token or ""> <page url> [puppeteer-core | puppeteer-core-24] [close]
// (which pinned Puppeteer, 25.x or 24.x; an empty token: no header, a connect ticket's address).
const STEP_LIMIT_MS = 30_000;
const [endpoint, token, url, ...rest] = process.argv.slice(2);
const module = rest.find((arg) => arg.startsWith("puppeteer-core")) ?? "puppeteer-core";
const mode = rest.includes("close") ? "close" : "read";
const { default: puppeteer } = await import(module);
const headers = token ? { Authorization: `Bearer ${token}` } : {};
const where = endpoint.startsWith("ws") ? { browserWSEndpoint: endpoint } : { browserURL: endpoint };
const browser = await puppeteer.connect({ ...where, headers, defaultViewport: null });

async function timed(steps, step, run) {
  const started = performance.now();
  let timer;
  const limit = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${step}: no answer in ${STEP_LIMIT_MS} ms`)), STEP_LIMIT_MS);
  });
  try {
    await Promise.race([run(), limit]);
    steps.push({ step, ms: Math.round(performance.now() - started) });
  } catch (error) {
    steps.push({ step, ms: Math.round(performance.now() - started), error: String(error) });
  } finally {
    clearTimeout(timer);
  }
}

async function closeEverything() {
  const steps = [];
  const opened = await browser.newPage();
  await opened.goto(url);
  await timed(steps, "close_opened", () => opened.close());
  const left = await browser.pages();
  for (const page of left) {
    await timed(steps, "close_page", () => page.close());
  }
  await timed(steps, "close_browser", () => browser.close());
  return { steps, pages_left: left.length, connected: browser.connected };
}

async function read() {
  try {
    const page = (await browser.pages())[0] ?? (await browser.newPage());
    const response = await page.goto(url);
    return {
      url: page.url(),
      status: response?.status() ?? null,
      title: await page.title(),
      text: await page.evaluate(() => document.body.innerText),
      version: await browser.version(),
    };
  } finally {
    await browser.disconnect();
  }
}

const result = mode === "close" ? await closeEverything() : await read();
process.stdout.write(JSON.stringify(result) + "\n");
