"""Debian's headless Chromium, for looking at what Tandem shows a person:
render an HTML file, report what every chart drew and every error the page
raised, and take a screenshot of the whole page."""

import json
import os
import pathlib
import re
import shutil
import subprocess
import tempfile

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"

# Added at the top of the page's <head>, in a copy: catches the page's
# errors (script errors, resources that failed to load, console.error).
_CATCH_ERRORS = (
    "<script>window.__tandemErrors=[];"
    "addEventListener('error',function(e){__tandemErrors.push(e.message||"
    "('failed to load '+(e.target&&(e.target.src||e.target.href))))},true);"
    "var __tandemConsoleError=console.error;console.error=function(){"
    "__tandemErrors.push(Array.prototype.join.call(arguments,' '));"
    "__tandemConsoleError.apply(console,arguments)};</script>")

# Added before </body>, in the copy: once the page has loaded, measures each
# chart (svg.chart) as laid out, and how many of its data marks (.data) have
# a non-empty box, and writes it all as JSON into <pre id="tandem-check">.
_MEASURE = (
    "<script>addEventListener('load',function(){var out={errors:"
    "__tandemErrors,resources:performance.getEntriesByType('resource')"
    ".map(function(r){return r.name}),height:document.documentElement"
    ".scrollHeight,charts:[]};document.querySelectorAll('svg.chart')"
    ".forEach(function(svg){var b=svg.getBoundingClientRect();var marks="
    "svg.querySelectorAll('.data');var drawn=0;marks.forEach(function(m){"
    "var bb=m.getBBox();if(bb.width>0||bb.height>0)drawn++});out.charts"
    ".push({chart:svg.getAttribute('data-chart'),width:b.width,height:"
    "b.height,marks:marks.length,drawn:drawn})});var pre=document"
    ".createElement('pre');pre.id='tandem-check';pre.textContent="
    "JSON.stringify(out);document.body.appendChild(pre)});</script>")


def missing():
    """Why Chromium cannot run here, or None."""
    if not os.access(CHROMIUM, os.X_OK):
        return ("no chromium (Debian package chromium; scripts/test.sh "
                "installs it)")
    return None


def _chromium(args, timeout=120):
    # As root Chromium needs --no-sandbox; --disable-gpu: no GPU here.
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
           "--hide-scrollbars", "--enable-logging=stderr", "--v=0"] + args
    return subprocess.run(cmd, capture_output=True, text=True,
                          timeout=timeout)


def console_messages(stderr):
    """The page's console lines from Chromium's log."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def render(html_path, screenshot_path, width=1280):
    """Renders `html_path` twice: a copy with the measuring scripts above
    (dumping the DOM), and the page itself as it is, into a PNG of the
    whole page at `width` pixels. Returns the measurement: {errors,
    resources, height, charts: [{chart, width, height, marks, drawn}],
    console: the console lines the unmodified page logged}."""
    html_path = pathlib.Path(html_path)
    page = html_path.read_text(encoding="utf-8")
    probe = page.replace("<head>", "<head>" + _CATCH_ERRORS, 1)
    probe = probe.replace("</body>", _MEASURE + "</body>", 1)
    with tempfile.TemporaryDirectory() as tmp:
        probe_path = pathlib.Path(tmp) / html_path.name
        probe_path.write_text(probe, encoding="utf-8")
        r = _chromium(["--window-size=%d,1000" % width, "--dump-dom",
                       probe_path.as_uri()])
    m = re.search(r'<pre id="tandem-check">(.*?)</pre>', r.stdout, re.S)
    if not m:
        raise AssertionError("Chromium rendered no measurement (exit %d):\n%s"
                             % (r.returncode, r.stderr[-3000:]))
    result = json.loads(m.group(1).replace("&amp;", "&")
                        .replace("&lt;", "<").replace("&gt;", ">"))
    height = max(int(result["height"]), 200)
    shot = _chromium(["--window-size=%d,%d" % (width, height),
                      "--screenshot=%s" % screenshot_path,
                      html_path.resolve().as_uri()])
    if not pathlib.Path(screenshot_path).is_file():
        raise AssertionError("Chromium wrote no screenshot (exit %d):\n%s" %
                             (shot.returncode, shot.stderr[-3000:]))
    result["console"] = console_messages(shot.stderr)
    return result
