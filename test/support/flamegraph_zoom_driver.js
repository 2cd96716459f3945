// Zooms mtrace's flame graph into one box in headless Chromium (through the
// script's own window.mtrace.zoom) and prints, as one JSON line, which
// boxes are then shown.
//   node flamegraph_zoom_driver.js PLAYWRIGHT_CORE_DIR CHROMIUM SVG BOX
const [pw, chromiumPath, svg, box] = process.argv.slice(2);
const { chromium } = require(pw);

(async () => {
  const browser = await chromium.launch({ executablePath: chromiumPath, args: ["--no-sandbox"] });
  const page = await browser.newPage();
  await page.goto("file://" + svg);
  const found = await page.evaluate((name) => window.mtrace.zoom(name), box);
  const shown = await page.$$eval("g.f", (gs) =>
    gs.filter((g) => g.style.display !== "none").map((g) => g.getAttribute("data-name"))
  );
  await browser.close();
  console.log(JSON.stringify({ found, shown }));
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
