// Puppeteer (puppeteer-core: it launches no browser) against Corral's CDP endpoint: connect with
// browserURL (or browserWSEndpoint) and the session token as a header, open the page in the
// session's Chromium, read it, print what it read as one JSON line, and disconnect (the browser stays).
// Run by tests/integration/test_cdp_frameworks.py:
//   node puppeteer_probe.mjs <cdp url> <session token or ""> <page url> [puppeteer-core | puppeteer-core-24]
// (the last: which pinned Puppeteer, 25.x or 24.x; an empty token: no header, a connect ticket's address).
const [endpoint, token, url, module = "puppeteer-core"] = process.argv.slice(2);
const { default: puppeteer } = await import(module);
const headers = token ? { Authorization: `Bearer ${token}` } : {};
const where = endpoint.startsWith("ws") ? { browserWSEndpoint: endpoint } : { browserURL: endpoint };
const browser = await puppeteer.connect({ ...where, headers, defaultViewport: null });
try {
  const page = (await browser.pages())[0] ?? (await browser.newPage());
  const response = await page.goto(url);
  const read = {
    url: page.url(),
    status: response?.status() ?? null,
    title: await page.title(),
    text: await page.evaluate(() => document.body.innerText),
    version: await browser.version(),
  };
  process.stdout.write(JSON.stringify(read) + "\n");
} finally {
  await browser.disconnect();
}
