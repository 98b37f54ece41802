"""Claude Code (`claude -p`) through the gateway: a task that runs a shell command, end to end.

Claude Code talks to `ANTHROPIC_BASE_URL` with the team's virtual key. The gateway routes the
model it asks for to an Anthropic deployment, here a fake Anthropic upstream: its default model
(`claude-opus-5-5`) through the pattern alias `claude-*`, or an alias of the gateway's named in
`ANTHROPIC_MODEL`. The fake answers the first request with a `Bash`
tool call; Claude Code runs the command and sends its output back; the fake answers with the
final text. The gateway must have relayed both requests as Claude Code wrote them (its betas
and Anthropic's own fields included) and recorded the run as one conversation of two turns.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

import pytest

from tests.clis.conftest import (
    TEAM,
    Sandbox,
    Secured,
    base_env,
    cli,
    run_cli,
    secured_gateway,
)
from tests.clis.upstreams import ClaudeUpstream, DeadEndProxy, tool_arguments
from tests.conftest import MakeGateway
from tests.fakes import API_KEY, PROMPT_TOKENS, MakeServer

CALL_ID = "toolu_01GatewayCliTest"
# What Claude Code 2.1.332 sends: its beta header's first value, the beta of context
# management, and the field itself.
CLAUDE_CODE_BETA = "claude-code-20250219"
CONTEXT_MANAGEMENT_BETA = "context-management-2025-06-27"
CONTEXT_MANAGEMENT = {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}
Json = dict[str, Any]


@dataclass(frozen=True)
class Setup:
    """How Claude Code is pointed at the gateway, and what the upstream then sees."""

    key_var: str  # where the team's key goes: a bearer token, or `x-api-key`
    model_env: str | None  # ANTHROPIC_MODEL, or None for Claude Code's default
    alias: Json  # the gateway's alias, its deployment's model given
    asked: str  # the model Claude Code asks for
    sent: str  # the model the upstream gets


SETUPS = {
    # Claude Code's own model ids (its default here), each passed whole by a pattern alias.
    "pattern-alias": Setup(
        "ANTHROPIC_AUTH_TOKEN",
        None,
        {"name": "claude-*", "model": "claude-*"},
        "claude-opus-5-5",
        "claude-opus-5-5",
    ),
    # One alias of the gateway's, named in ANTHROPIC_MODEL.
    "anthropic-model": Setup(
        "ANTHROPIC_API_KEY",
        "team-sonnet",
        {"name": "team-sonnet", "model": "claude-sonnet-4-5"},
        "team-sonnet",
        "claude-sonnet-4-5",
    ),
}


async def claude_gateway(
    make_gateway: MakeGateway, aiohttp_server: MakeServer, setup: Setup
) -> tuple[Secured, ClaudeUpstream]:
    """The gateway Claude Code is pointed at: the setup's alias to the fake Anthropic
    upstream."""
    upstream = await ClaudeUpstream().start(aiohttp_server)
    models = [
        {
            "name": setup.alias["name"],
            # Claude Code retries by itself; one attempt lets the test see each request.
            "retry": {"max_attempts": 1},
            "deployments": [upstream.deployment(model=setup.alias["model"])],
        }
    ]
    return await secured_gateway(make_gateway, models), upstream


def claude_env(
    secured: Secured, sandbox: Sandbox, proxy: DeadEndProxy, setup: Setup
) -> dict[str, str]:
    env = {
        **base_env(sandbox, proxy),
        "ANTHROPIC_BASE_URL": secured.gw.url,
        setup.key_var: secured.team_key,
        "CLAUDE_CONFIG_DIR": str(sandbox.home / ".claude"),
        "CLAUDE_CODE_TMPDIR": str(sandbox.tmp),
        # Offline: no telemetry, error reports, update checks or other side traffic.
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_AUTOUPDATER": "1",
    }
    if setup.model_env is not None:
        env["ANTHROPIC_MODEL"] = setup.model_env
    return env


def text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content if b.get("type") == "text")


def conversation_view(message: Json) -> tuple[str, str]:
    """A message as a model reads it: its role and text, whatever the block shapes and cache
    markers Claude Code put on it this time."""
    return message["role"], text_of(message["content"])


@pytest.mark.parametrize("setup", SETUPS.values(), ids=SETUPS.keys())
async def test_claude_code_runs_a_tool_task_recorded_as_one_conversation(
    make_gateway: MakeGateway,
    aiohttp_server: MakeServer,
    sandbox: Sandbox,
    proxy: DeadEndProxy,
    setup: Setup,
) -> None:
    """`claude -p` with the team's key: the Bash tool runs, the answer comes back, and the
    gateway keeps one conversation of two turns."""
    claude = cli("claude")
    secured, upstream = await claude_gateway(make_gateway, aiohttp_server, setup)
    token = secrets.token_hex(6)
    command = f"printf 'ran-%s\\n' {token}"
    output = f"ran-{token}"  # what the command prints, which the command's text does not hold
    final = f"The command printed {output}."
    upstream.tool_call(CALL_ID, "Bash", tool_arguments({"command": command}))
    upstream.text(["The command ", f"printed {output}."])
    prompt = f"Run the shell command {command} and tell me what it printed."

    run = await run_cli(
        [str(claude), "-p", prompt, "--allowedTools", "Bash", "--output-format", "json"],
        claude_env(secured, sandbox, proxy, setup),
        sandbox.work,
    )

    # What the user got.
    assert run.returncode == 0, f"stderr:\n{run.stderr}\nstdout:\n{run.stdout}"
    result = json.loads(run.stdout)
    assert (result["subtype"], result["is_error"], result["result"]) == ("success", False, final)
    assert result["num_turns"] == 2
    assert proxy.attempts == [], "Claude Code tried to reach beyond loopback"

    # What the upstream got: two streamed requests, the second carrying the command's output.
    assert upstream.strays == []
    assert len(upstream.requests) == 2
    first, second = upstream.requests
    for request, body in zip(upstream.seen, upstream.requests, strict=True):
        assert request.path == "/v1/messages"
        assert request.headers["x-api-key"] == API_KEY  # the deployment's, never the team's
        assert secured.team_key not in json.dumps([dict(request.headers), body])
        assert (body["model"], body["stream"]) == (setup.sent, True)
    assert "Bash" in [tool["name"] for tool in first["tools"]]
    # Claude Code's environment block, a system message inside the history, went on too.
    assert [m["role"] for m in first["messages"]] == ["user", "system"]
    assert prompt in text_of(first["messages"][0]["content"])
    assert [conversation_view(m) for m in second["messages"][: len(first["messages"])]] == [
        conversation_view(m) for m in first["messages"]
    ]
    call, answer = second["messages"][len(first["messages"]) :]
    assert call == {
        "role": "assistant",
        "content": [
            {"type": "tool_use", "id": CALL_ID, "name": "Bash", "input": {"command": command}}
        ],
    }
    (tool_result,) = answer["content"]
    assert answer["role"] == "user"
    assert (tool_result["type"], tool_result["tool_use_id"]) == ("tool_result", CALL_ID)
    assert (text_of(tool_result["content"]), tool_result["is_error"]) == (output, False)

    # The gateway: one conversation of the team's key, both turns in it.
    conversation_id, events = await secured.only_conversation(turns=2)
    assert [e["type"] for e in events["data"]] == [
        "user/message",
        "assistant/message",
        "turn/end",
        "tool/result",
        "assistant/message",
        "turn/end",
    ]
    assert [e["payload"]["status"] for e in events["data"] if e["type"] == "turn/end"] == [
        "completed",
        "completed",
    ]
    status, history = await secured.admin("GET", f"/v1/conversations/{conversation_id}/messages")
    assert status == 200, history
    user, assistant_call, tool, assistant_final = history["data"]
    assert user["role"] == "user" and prompt in text_of(user["content"])
    assert assistant_call["tool_calls"] == [
        {
            "id": CALL_ID,
            "type": "function",
            "function": {"name": "Bash", "arguments": json.dumps({"command": command})},
        }
    ]
    assert tool == {"role": "tool", "tool_call_id": CALL_ID, "content": output}
    assert assistant_final == {"role": "assistant", "content": final}

    # Claude Code's betas and Anthropic's own fields went on as the CLI sent them: the turn
    # records what the client sent, the upstream shows what arrived.
    for turn, request, body in zip(events["turns"], upstream.seen, upstream.requests, strict=True):
        sent = turn["request"]
        assert (sent["endpoint"], sent["model"]) == ("anthropic.messages", setup.asked)
        assert sent["headers"]["user-agent"].startswith("claude-cli/")
        # The end user: Claude Code's metadata.user_id, a JSON string naming its session.
        assert sent["user"] == body["metadata"]["user_id"]
        assert {"device_id", "session_id"} <= json.loads(sent["user"]).keys()
        betas = sent["headers"]["anthropic-beta"].split(",")
        assert {CLAUDE_CODE_BETA, CONTEXT_MANAGEMENT_BETA} <= set(betas)
        assert request.headers["anthropic-beta"] == sent["headers"]["anthropic-beta"]
        assert request.headers["anthropic-version"] == sent["headers"]["anthropic-version"]
        assert body["context_management"] == CONTEXT_MANAGEMENT
        extras = sent["params"]["anthropic_extras"]  # Anthropic's own fields, as recorded
        assert body["context_management"] == extras["context_management"]
        assert body["output_config"] == extras["output_config"]
        assert body["thinking"] == sent["params"]["thinking"]

    # Usage: one row per turn, the team's and its key's.
    row = (TEAM, secured.key_id, setup.alias["name"], setup.sent, "completed", PROMPT_TOKENS)
    assert secured.usage(conversation_id) == [row, row]
