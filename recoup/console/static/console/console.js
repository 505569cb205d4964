// The console's session page: a state badge fed by the lifecycle event stream, the sandbox
// flow (start, loading with progress, ready, hibernated, resume), a command box with streamed
// output, and the lifecycle history kept current. Every action is a call to the REST API with the
// console's session cookie and CSRF token. Text from the API is only ever set as textContent.
// Where a stream endpoint is missing (404), the page falls back to polling and plain commands.
(function () {
  "use strict";
  const root = document.getElementById("console-session");
  if (!root) return;
  const sessionId = root.dataset.sessionId;
  const csrfToken = document.querySelector('meta[name="csrf-token"]').content;
  const $ = (id) => document.getElementById(id);
  const q = (params) => "?" + new URLSearchParams({ sessionId, ...params }).toString();

  const FLOW = {
    new: ["not started", "No sandbox yet. Start one to clone the repository into it.", ["start"]],
    provisioning: ["provisioning", "Loading your sandbox…", []],
    restoring: ["restoring", "Resuming your sandbox from its snapshot…", []],
    active: ["active", "Ready. Run a command below.", ["hibernate"]],
    hibernating: ["hibernating", "Hibernating: saving a snapshot of the workspace…", []],
    hibernated: ["hibernated", "Hibernated. The workspace is saved; resume to carry on.", ["resume"]],
    failed: ["failed", "The sandbox failed.", ["start"]],
    archived: ["archived", "Archived. Set its status to running through the API to resume it.", []],
  };
  const BUSY = new Set(["provisioning", "restoring", "hibernating"]);

  const view = {
    state: root.dataset.state,
    version: Number(root.dataset.version),
    error: root.dataset.error || "",
    progress: null, // {phase, percent} while a provisioning reports one
    pending: false, // an action of this page is in flight
    requested: false, // a hibernation was accepted and the worker has not started it yet
  };

  // --- the REST API ---------------------------------------------------------------------
  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  async function api(method, path, body) {
    const init = { method, credentials: "same-origin", headers: { Accept: "application/json" } };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.headers["X-CSRFToken"] = csrfToken;
      init.body = JSON.stringify(body);
    }
    const response = await fetch(path, init);
    if (response.status === 401) {
      window.location.assign("/"); // the console session ended (a revoked key): sign in again
      throw new ApiError(401, "Signed out");
    }
    let data = null;
    try {
      data = await response.json();
    } catch (e) {
      data = null;
    }
    if (!response.ok) {
      throw new ApiError(response.status, (data && data.error) || "HTTP " + response.status);
    }
    return { status: response.status, data };
  }

  // --- the badge and the flow -----------------------------------------------------------
  function shownState() {
    // A session is created in `provisioning` at version 0: nothing has started yet.
    if (view.state === "provisioning" && view.version === 0 && !view.pending) return "new";
    return view.state;
  }

  function render() {
    const state = shownState();
    let [label, message, actions] = FLOW[state] || [state, state, []];
    if (state === "active" && view.requested) {
      [message, actions] = ["Hibernation requested: the worker saves a snapshot shortly…", []];
    }
    const badge = $("badge");
    badge.textContent = label;
    badge.dataset.state = state;
    $("flow").dataset.state = state;
    $("flow-message").textContent =
      state === "failed" && view.error ? message + " " + view.error : message;
    const loading = BUSY.has(state);
    const progress = $("progress");
    progress.hidden = !loading;
    if (loading && view.progress && view.progress.percent !== null) {
      progress.value = view.progress.percent;
    } else {
      progress.removeAttribute("value"); // indeterminate
    }
    $("progress-label").textContent =
      loading && view.progress
        ? view.progress.phase +
          (view.progress.percent !== null ? " " + view.progress.percent + "%" : "")
        : "";
    for (const name of ["start", "resume", "hibernate"]) {
      $(name).hidden = view.pending || !actions.includes(name);
    }
    $("start").textContent = state === "failed" ? "Try again" : "Start sandbox";
    const repoNeeded = !root.dataset.repoUrl && (state === "new" || state === "failed");
    $("repo-field").hidden = !repoNeeded;
    const ready = state === "active" && !view.requested;
    $("command").disabled = !ready;
    $("run").disabled = !ready || running !== null;
  }

  // Applies what the server says, unless it is older than what the page shows already.
  function applyState(state, version, extra) {
    const known = version !== undefined && version !== null;
    if (known && version < view.version) return;
    // While an action runs, the page shows what it started; the server confirms by a new version.
    if (known && version === view.version && view.pending) return;
    if (known && version > view.version) {
      view.requested = false;
      refreshHistory();
    }
    if (known) view.version = version;
    if (state !== view.state) view.progress = null;
    view.state = state;
    if (extra && "error" in extra) view.error = extra.error || "";
    if (extra && "progress" in extra) view.progress = extra.progress;
    render();
  }

  function applyStatus(body) {
    applyState(body.lifecycle.state, body.lifecycleVersion);
  }

  async function refreshStatus() {
    try {
      applyStatus((await api("GET", "/api/sandbox/status" + q({}))).data);
    } catch (e) {
      // the next poll or event tries again
    }
  }

  function showActionError(message) {
    $("action-error").textContent = message;
  }

  async function act(fn) {
    view.pending = true;
    showActionError("");
    render();
    try {
      await fn();
    } catch (e) {
      showActionError(e.message);
    } finally {
      view.pending = false;
      await refreshStatus();
      render();
    }
  }

  function repoUrl() {
    return root.dataset.repoUrl || $("repo-input").value.trim();
  }

  // POST /api/sandbox provisions or resumes and answers once the sandbox is up (seconds).
  function startOrResume() {
    const resuming = view.state === "hibernated";
    return act(async () => {
      applyState(resuming ? "restoring" : "provisioning", null);
      await api("POST", "/api/sandbox", { repoUrl: repoUrl(), sessionId });
    });
  }

  $("start").addEventListener("click", startOrResume);
  $("resume").addEventListener("click", startOrResume);
  $("hibernate").addEventListener("click", () =>
    act(async () => {
      const body = (await api("POST", "/api/sandbox/hibernate", { sessionId })).data;
      if (body.lifecycleVersion === view.version) view.requested = true; // the worker's to do
      applyStatus(body);
    })
  );

  // --- the lifecycle: events, or polling when the stream is unavailable --------------------
  // The history is the server's: on a new version, the page's own table is fetched again and
  // swapped in. DOMParser runs no script, and every value in it was escaped by the template.
  let historyLoading = null;
  async function refreshHistory() {
    if (historyLoading) return historyLoading.then(refreshHistory);
    historyLoading = (async () => {
      const response = await fetch(window.location.pathname, { credentials: "same-origin" });
      if (!response.ok) return;
      const page = new DOMParser().parseFromString(await response.text(), "text/html");
      const fresh = page.querySelector("#history tbody");
      if (fresh) $("history").replaceChild(document.adoptNode(fresh), $("history").tBodies[0]);
    })()
      .catch(() => {})
      .finally(() => (historyLoading = null));
    return historyLoading;
  }

  let pollTimer = null;
  function startPolling() {
    if (pollTimer === null) pollTimer = window.setInterval(refreshStatus, 2000);
  }

  function followEvents() {
    if (!window.EventSource) return startPolling();
    const events = new EventSource("/api/sandbox/events" + q({}));
    const data = (message) => JSON.parse(message.data);
    events.addEventListener("state", (m) => {
      const d = data(m);
      applyState(d.state, d.version, { progress: d.provisioning || null });
    });
    events.addEventListener("transition", (m) => {
      const d = data(m);
      applyState(d.state, d.version);
    });
    events.addEventListener("progress", (m) => {
      const d = data(m);
      view.progress = { phase: d.phase, percent: d.percent === undefined ? null : d.percent };
      render();
    });
    events.onerror = () => {
      // CLOSED: refused for good (404 on a server without the stream, 401, ...); a dropped
      // connection is CONNECTING and EventSource reconnects by itself.
      if (events.readyState === EventSource.CLOSED) startPolling();
    };
  }

  // --- commands ---------------------------------------------------------------------------
  let running = null; // {commandId, logs} of a detached command being followed

  function appendOutput(stream, text) {
    const out = $("output");
    const span = document.createElement("span");
    span.className = stream;
    span.textContent = text;
    out.appendChild(span);
    out.scrollTop = out.scrollHeight;
  }

  function showExit(text) {
    $("exit").textContent = text;
  }

  function commandFinished() {
    if (running && running.logs) running.logs.close();
    running = null;
    $("kill").hidden = true;
    render();
  }

  function showResult(result) {
    if (result.stdout) appendOutput("stdout", result.stdout);
    if (result.stderr) appendOutput("stderr", result.stderr);
    const notes = [result.timedOut ? "timed out" : "", result.truncated ? "output truncated" : ""];
    showExit("exit " + result.exitCode + notes.filter(Boolean).map((n) => " (" + n + ")").join(""));
  }

  function followLogs(commandId) {
    const path = "/api/sandbox/commands/" + encodeURIComponent(commandId);
    const logs = new EventSource(path + "/logs" + q({}));
    running = { commandId, logs };
    $("kill").hidden = false;
    const chunk = (m) => {
      const d = JSON.parse(m.data);
      appendOutput(d.stream || m.type, d.data);
    };
    logs.addEventListener("stdout", chunk);
    logs.addEventListener("stderr", chunk);
    logs.addEventListener("exit", (m) => {
      showExit("exit " + JSON.parse(m.data).exitCode);
      commandFinished();
    });
    logs.onerror = async () => {
      if (logs.readyState !== EventSource.CLOSED) return; // reconnects from its last offset
      commandFinished();
      try {
        const d = (await api("GET", path + q({}))).data;
        showExit(d.exitCode === null ? "still running (no output stream)" : "exit " + d.exitCode);
      } catch (e) {
        showExit("output unavailable: " + e.message);
      }
    };
  }

  async function runCommand(line) {
    const body = { sessionId, cmd: "sh", args: ["-c", line] };
    let answer;
    try {
      answer = await api("POST", "/api/sandbox/commands", { ...body, detached: true });
    } catch (e) {
      // A server that refuses `detached` ran nothing: run it the plain way.
      if (!(e.status === 400 && /detached/.test(e.message))) throw e;
      answer = await api("POST", "/api/sandbox/commands", body);
    }
    if (answer.status === 202) {
      followLogs(answer.data.commandId);
    } else {
      showResult(answer.data); // a server without detached commands ran it to its end
      commandFinished();
    }
  }

  $("command-form").addEventListener("submit", async (submitted) => {
    submitted.preventDefault();
    const line = $("command").value;
    if (!line.trim() || running !== null) return;
    $("output").textContent = "";
    showExit("");
    appendOutput("prompt", "$ " + line + "\n");
    running = { commandId: null, logs: null };
    render();
    try {
      await runCommand(line);
    } catch (e) {
      showExit("error: " + e.message);
      commandFinished();
    }
  });

  $("kill").addEventListener("click", async () => {
    if (!running || !running.commandId) return;
    const path = "/api/sandbox/commands/" + encodeURIComponent(running.commandId) + "/kill";
    try {
      await api("POST", path, { sessionId });
    } catch (e) {
      showExit("could not stop it: " + e.message);
    }
  });

  render();
  followEvents();
})();
