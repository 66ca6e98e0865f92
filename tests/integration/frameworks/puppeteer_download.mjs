// Puppeteer (puppeteer-core) downloading through Corral as its docs say: Browser.setDownloadBehavior
// to a folder of this machine with events on, a click on a download link, the download's events. The
// file itself is fetched through Corral's downloads API (docs/cdp.md); this prints what Puppeteer saw
// as one JSON line. Run by tests/integration/test_downloads.py:
//   node puppeteer_download.mjs <ws cdp url> <session token> <page url> <download folder>
import puppeteer from "puppeteer-core";

const [endpoint, token, url, folder] = process.argv.slice(2);
const headers = { Authorization: `Bearer ${token}` };
const browser = await puppeteer.connect({ browserWSEndpoint: endpoint, headers, defaultViewport: null });
try {
  const client = await browser.target().createCDPSession();
  await client.send("Browser.setDownloadBehavior", { behavior: "allow", downloadPath: folder, eventsEnabled: true });
  const seen = {};
  const ended = new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("no download event")), 30000);
    client.on("Browser.downloadWillBegin", (event) => {
      Object.assign(seen, { guid: event.guid, url: event.url, suggested: event.suggestedFilename });
    });
    client.on("Browser.downloadProgress", (event) => {
      if (event.state !== "inProgress") {
        clearTimeout(timer);
        resolve(event.state);
      }
    });
  });
  const page = (await browser.pages())[0] ?? (await browser.newPage());
  await page.goto(url);
  await page.click("#get");
  seen.state = await ended;
  seen.version = await browser.version();
  process.stdout.write(JSON.stringify(seen) + "\n");
} finally {
  await browser.disconnect();
}
