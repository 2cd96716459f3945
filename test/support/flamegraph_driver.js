// Drives mtrace's flame graph in headless Chromium for its tests: opens the
// SVG, clicks a box to zoom, takes a screenshot, resets, searches through the
// Search button's prompt, takes another screenshot, and prints what it saw
// as one JSON line.
//   node flamegraph_driver.js PLAYWRIGHT_CORE_DIR CHROMIUM SVG WIDTH HEIGHT BOX TERM OUT_DIR
const [pw, chromiumPath, svg, width, height, box, term, out] = process.argv.slice(2);
const { chromium } = require(pw);

(async () => {
  const browser = await chromium.launch({ executablePath: chromiumPath, args: ["--no-sandbox"] });
  const page = await browser.newPage({ viewport: { width: +width, height: +height } });
  await page.goto("file://" + svg);
  const rect = `g.f[data-name="${box}"] rect`;
  const before = await page.$eval(rect, (r) => +r.getAttribute("width"));
  await page.click(rect);
  const zoomed = await page.$eval(rect, (r) => +r.getAttribute("width"));
  const resetShown = await page.$eval("#reset", (t) => t.style.display !== "none");
  const hidden = await page.$$eval("g.f", (gs) => gs.filter((g) => g.style.display === "none").length);
  await page.screenshot({ path: out + "/zoomed.png" });
  await page.click("#reset");
  const afterReset = await page.$eval(rect, (r) => +r.getAttribute("width"));
  page.once("dialog", (dialog) => dialog.accept(term));
  await page.click("#search");
  const matched = await page.$eval("#matched", (t) => t.textContent);
  await page.screenshot({ path: out + "/searched.png" });
  await browser.close();
  console.log(JSON.stringify({ before, zoomed, resetShown, hidden, afterReset, matched }));
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
