"""A learner's or the instructor's pages of a workshop hub, driven in a browser page (Playwright): the hub's
login form, and a command typed into a new terminal of a learner's JupyterLab."""

from __future__ import annotations

import time

# Run in a learner's JupyterLab page: a new terminal of the learner's server, ``cmd`` typed into it; resolves to
# what the terminal printed up to the end marker (the exit code follows it), or rejects after ``ms``.
TERMINAL_JS = """async ([base, cmd, ms]) => {
  const xsrf = decodeURIComponent((document.cookie.split('; ').find(c => c.startsWith('_xsrf=')) || '=').split('=')[1]);
  const r = await fetch(base + 'api/terminals', {method: 'POST', headers: {'X-XSRFToken': xsrf}});
  if (!r.ok) throw new Error('terminal: ' + r.status);
  const name = (await r.json()).name;
  const ws = new WebSocket(location.origin.replace('http', 'ws') + base + 'terminals/websocket/' + name);
  return await new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => { ws.close(); reject(new Error('timeout: ' + out.slice(-2000))); }, ms);
    ws.onopen = () => ws.send(JSON.stringify(['stdin', cmd + '; echo "END-$((6*7))-$?"\\r']));
    ws.onmessage = (e) => {
      const m = JSON.parse(e.data);
      if (m[0] !== 'stdout') return;
      out += m[1];
      const at = out.indexOf('END-42-');
      if (at >= 0 && /END-42-\\d+/.test(out)) { clearTimeout(timer); ws.close(); resolve(out); }
    };
    ws.onerror = () => reject(new Error('websocket error'));
  });
}"""


def login(page, url: str, who: str, password: str) -> float:  # noqa: ANN001
    """Log in through the hub's form; seconds from submitting it to JupyterLab's shell (or the hub's home)."""
    page.goto(url + "hub/login", timeout=60_000)
    page.fill("input#username_input", who)
    page.fill("input#password_input", password)
    start = time.monotonic()
    page.click("#login_submit")
    if who.startswith("learner"):
        page.wait_for_selector("#jp-main-dock-panel", timeout=240_000)
    else:
        page.wait_for_url("**/hub/**", timeout=60_000)
    return time.monotonic() - start


def terminal(page, who: str, cmd: str, timeout: float = 120) -> str:  # noqa: ANN001
    return page.evaluate(TERMINAL_JS, [f"/user/{who}/", cmd, int(timeout * 1000)])
