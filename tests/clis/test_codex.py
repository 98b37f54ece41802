"""The OpenAI Codex CLI (`codex exec`) through the gateway's Responses API: a task that runs a
shell command, end to end.

Codex reads a custom model provider from `$CODEX_HOME/config.toml`: the gateway's `/v1` as
`base_url`, `wire_api = "responses"`, the team's virtual key from the environment variable
that `env_key` names. The gateway routes the alias to an `openai` deployment with `api:
responses`, here a fake of OpenAI's Responses API: Codex's own wire on both sides, as with a
gateway in front of OpenAI. The fake answers the first request with a call of the shell tool
Codex offers (`exec_command`); Codex runs the command and sends its output back; the fake
answers with the final text.

Codex keeps no state on the server (`store: false`, no `previous_response_id`): it sends the
whole input again each time, which the gateway threads into one conversation by its history.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from tests.clis.conftest import (
    TEAM,
    Run,
    Sandbox,
    Secured,
    base_env,
    cli,
    run_cli,
    secured_gateway,
)
from tests.clis.upstreams import DeadEndProxy, ResponsesUpstream, tool_arguments
from tests.conftest import MakeGateway
from tests.fakes import API_KEY, PROMPT_TOKENS, MakeServer

ALIAS = "codex-agent"  # not a model Codex knows, so it offers its plain function tools
KEY_VAR = "GATEWAY_API_KEY"
CALL_ID = "call_GatewayCliTest"
Json = dict[str, Any]

# The tools Codex offers beyond function tools, off: subagents (a `namespace` tool) and web
# search (OpenAI's hosted `web_search`). They reach a deployment that speaks the Responses API
# itself; any other refuses them by name unless its alias drops them (`drop_params`).
FUNCTION_TOOLS_ONLY = """\
web_search = "disabled"

[agents]
enabled = false
"""


def codex_config(gateway_url: str, tools: str = FUNCTION_TOOLS_ONLY) -> str:
    """`$CODEX_HOME/config.toml`: the gateway as the model provider, `tools` (top-level keys
    first, then tables), and off everything that would reach beyond the gateway (analytics,
    feedback, OpenTelemetry, plugin and app syncs, update checks)."""
    return f"""\
model = "{ALIAS}"
model_provider = "gateway"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false
{tools}
[model_providers.gateway]
name = "LLM gateway"
base_url = "{gateway_url}/v1"
env_key = "{KEY_VAR}"
wire_api = "responses"

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"
trace_exporter = "none"
metrics_exporter = "none"

[features]
plugins = false
apps = false
remote_plugin = false
"""


async def codex_gateway(
    make_gateway: MakeGateway, aiohttp_server: MakeServer
) -> tuple[Secured, ResponsesUpstream]:
    """The gateway Codex is pointed at: the alias to the fake Responses upstream."""
    upstream = await ResponsesUpstream().start(aiohttp_server)
    models = [
        {
            "name": ALIAS,
            # Codex retries by itself; one attempt lets the test see each request.
            "retry": {"max_attempts": 1},
            "deployments": [upstream.deployment()],
        }
    ]
    return await secured_gateway(make_gateway, models), upstream


async def codex_exec(
    secured: Secured, sandbox: Sandbox, proxy: DeadEndProxy, prompt: str, config: str
) -> Run:
    """`codex exec --json PROMPT` in the sandbox, with `config` as its config.toml."""
    codex = cli("codex")
    codex_home = sandbox.home / ".codex"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(config)
    env = {**base_env(sandbox, proxy), "CODEX_HOME": str(codex_home), KEY_VAR: secured.team_key}
    argv = [str(codex), "exec", "--skip-git-repo-check", "--json", prompt]
    return await run_cli(argv, env, sandbox.work)


def events_of(run: Run) -> list[Json]:
    """`codex exec --json`'s events: one JSON object a line."""
    return [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]


def completed(events: list[Json], kind: str) -> list[Json]:
    return [
        e["item"] for e in events if e["type"] == "item.completed" and e["item"]["type"] == kind
    ]


class Task:
    """The task: run a command whose output its text does not hold, then say what it printed."""

    def __init__(self) -> None:
        self.token = secrets.token_hex(6)
        self.command = f"printf 'ran-%s\\n' {self.token}"
        self.output = f"ran-{self.token}"
        self.final = f"The command printed {self.output}."
        self.prompt = f"Run the shell command {self.command} and tell me what it printed."

    def script(self, upstream: ResponsesUpstream) -> None:
        upstream.tool_call(CALL_ID, "exec_command", tool_arguments({"cmd": self.command}))
        upstream.text(["The command ", f"printed {self.output}."])


async def test_codex_exec_runs_a_tool_task_recorded_as_one_conversation(
    make_gateway: MakeGateway,
    aiohttp_server: MakeServer,
    sandbox: Sandbox,
    proxy: DeadEndProxy,
) -> None:
    """`codex exec` with the team's key: the shell tool runs, the answer comes back, and the
    gateway keeps one conversation of two turns."""
    secured, upstream = await codex_gateway(make_gateway, aiohttp_server)
    task = Task()
    task.script(upstream)

    run = await codex_exec(secured, sandbox, proxy, task.prompt, codex_config(secured.gw.url))

    # What the user got: the command ran, the answer came back.
    assert run.returncode == 0, f"stderr:\n{run.stderr}\nstdout:\n{run.stdout}"
    events = events_of(run)
    (execution,) = completed(events, "command_execution")
    assert task.token in execution["command"]  # as Codex ran it: in the user's shell
    assert (execution["exit_code"], execution["aggregated_output"]) == (0, task.output + "\n")
    assert [m["text"] for m in completed(events, "agent_message")] == [task.final]
    assert events[-1]["type"] == "turn.completed"
    assert proxy.attempts == [], "Codex tried to reach beyond loopback"

    # What the upstream got: two streamed requests, the second carrying the command's output.
    assert upstream.strays == []
    assert len(upstream.requests) == 2
    first, second = upstream.requests
    for request, body in zip(upstream.seen, upstream.requests, strict=True):
        assert request.path == "/v1/responses"
        assert request.headers["Authorization"] == f"Bearer {API_KEY}"  # never the team's key
        assert secured.team_key not in json.dumps([dict(request.headers), body])
        assert (body["model"], body["stream"], body["store"]) == (upstream.model, True, False)
        assert "previous_response_id" not in body  # the whole history, every time
        assert {"type": "function", "name": "exec_command"}.items() <= body["tools"][0].items()
        assert body["instructions"].startswith("You are a coding agent running in the Codex CLI")
    assert first["input"][-1] == {"role": "user", "content": task.prompt}
    assert second["instructions"] == first["instructions"]
    assert second["input"][: len(first["input"])] == first["input"]
    call, result = second["input"][len(first["input"]) :]
    assert call == {
        "type": "function_call",
        "call_id": CALL_ID,
        "name": "exec_command",
        "arguments": json.dumps({"cmd": task.command}),
    }
    assert (result["type"], result["call_id"]) == ("function_call_output", CALL_ID)
    # Codex's report of the run: exit code, then the command's real output.
    assert "Process exited with code 0\n" in result["output"]
    assert result["output"].endswith(f"Output:\n{task.output}\n")

    # The gateway: one conversation of the team's key, both turns in it.
    conversation_id, recorded = await secured.only_conversation(turns=2)
    assert [e["type"] for e in recorded["data"]] == [
        "user/message",  # Codex's <environment_context>
        "user/message",  # the prompt
        "assistant/message",
        "turn/end",
        "tool/result",
        "assistant/message",
        "turn/end",
    ]
    for turn in recorded["turns"]:
        sent = turn["request"]
        assert (sent["endpoint"], sent["model"], sent["stream"]) == (
            "openai.responses",
            ALIAS,
            True,
        )
        assert sent["headers"]["user-agent"].startswith("codex_exec/")
        # Codex's developer messages are the turn's instructions, not its history.
        assert [i["role"] for i in sent["instructions"]] == ["system", "system"]
    status, history = await secured.admin("GET", f"/v1/conversations/{conversation_id}/messages")
    assert status == 200, history
    context, user, assistant_call, tool, assistant_final = history["data"]
    assert context["role"] == "user" and "<environment_context>" in context["content"]
    assert user == {"role": "user", "content": task.prompt}
    assert assistant_call["tool_calls"] == [
        {
            "id": CALL_ID,
            "type": "function",
            "function": {"name": "exec_command", "arguments": json.dumps({"cmd": task.command})},
        }
    ]
    assert (tool["role"], tool["tool_call_id"], tool["content"]) == (
        "tool",
        CALL_ID,
        result["output"],
    )
    assert assistant_final == {"role": "assistant", "content": task.final}

    # Usage: one row per turn, the team's and its key's.
    row = (TEAM, secured.key_id, ALIAS, upstream.model, "completed", PROMPT_TOKENS)
    assert secured.usage(conversation_id) == [row, row]


async def test_codex_exec_with_its_default_tools(
    make_gateway: MakeGateway,
    aiohttp_server: MakeServer,
    sandbox: Sandbox,
    proxy: DeadEndProxy,
) -> None:
    """Codex as installed, subagents and web search on: the same task runs end to end, its
    tools that are no function (a `namespace` of subagent functions, the hosted `web_search`)
    reaching the Responses upstream as Codex sent them."""
    secured, upstream = await codex_gateway(make_gateway, aiohttp_server)
    task = Task()
    task.script(upstream)

    run = await codex_exec(secured, sandbox, proxy, task.prompt, codex_config(secured.gw.url, ""))

    assert proxy.attempts == [], "Codex tried to reach beyond loopback"
    assert len(upstream.requests) == 2, f"stdout:\n{run.stdout}"
    assert run.returncode == 0, f"stderr:\n{run.stderr}\nstdout:\n{run.stdout}"
    events = events_of(run)
    assert [m["text"] for m in completed(events, "agent_message")] == [task.final]
    await secured.only_conversation(turns=2)
    kinds = {t["type"] for t in upstream.requests[0]["tools"]}
    assert {"function", "namespace", "web_search"} <= kinds


async def test_codex_function_tools_reach_the_responses_upstream_as_sent(
    make_gateway: MakeGateway,
    aiohttp_server: MakeServer,
    sandbox: Sandbox,
    proxy: DeadEndProxy,
) -> None:
    """Each function tool Codex offers reaches the Responses upstream with its `strict`."""
    secured, upstream = await codex_gateway(make_gateway, aiohttp_server)
    task = Task()
    task.script(upstream)

    run = await codex_exec(secured, sandbox, proxy, task.prompt, codex_config(secured.gw.url))

    assert run.returncode == 0, f"stderr:\n{run.stderr}\nstdout:\n{run.stdout}"
    _, recorded = await secured.only_conversation(turns=2)
    offered = [t["function"] for t in recorded["turns"][0]["request"]["params"]["tools"]]
    assert {f.get("strict") for f in offered} == {False}  # what Codex 0.171.0 sends
    for body in upstream.requests:
        arrived = {t["name"]: t.get("strict") for t in body["tools"]}
        assert arrived == {f["name"]: f["strict"] for f in offered}
