"""Screenshots of the Dagster UI (`make ui` on :3000 after `make demo`) in Debian's Chromium, for docs/ui.md."""
import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

OUT = Path(sys.argv[1])
OUT.mkdir(parents=True, exist_ok=True)
BASE = "http://127.0.0.1:3000"
LOC = "__repository__@pivot_curation"
PAGES = {"overview": "/overview/activity/timeline", "asset_graph": "/asset-groups",
         "pipeline_job": f"/locations/{LOC}/jobs/pivot_pipeline/runs", "runs": "/runs",
         "turn_profiles": "/assets/turn_profiles", "pivots_adv": "/assets/pivots_adv",
         "pivot_eval": "/assets/pivot_eval"}

with sync_playwright() as p:
    browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    for name, path in PAGES.items():
        page.goto(BASE + path)
        page.wait_for_timeout(6000)
        skip = page.get_by_role("button", name="Skip")
        if skip.count():
            skip.first.click()
            page.wait_for_timeout(1000)
        page.screenshot(path=str(OUT / f"{name}.png"))
        print(name, (OUT / f"{name}.png").stat().st_size)
    browser.close()
