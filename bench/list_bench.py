"""`python -m bench.list_bench`: does the conversation list answer within 200 ms at 100,000
conversations, on SQLite and on PostgreSQL?

Seeds `--conversations` conversations (1 to 3 turns each: a user message, an assistant answer
and a turn end, English-like text of a Zipf-distributed vocabulary; an attempt's usage record a
turn, one turn in 20 with a failed attempt before it; 40 teams, 1,000 users, metadata on a
third) into a fresh SQLite file and a throwaway PostgreSQL (started as the tests start theirs,
or `--url`). The schema is the real one, made by the store's migrations; rows go in through
bulk SQL (`executemany`, `COPY`), the search index filled as the store fills it (SQLite's
statement of each batch, PostgreSQL's generated column), then each conversation's totals are
made as the migration makes them. PostgreSQL is ANALYZEd, as autovacuum would; SQLite is
not, as a gateway never does.

Then times each list query through `list_conversations` (the SQL and the rows made into the
answer, without HTTP), `--runs` times each after one warm-up: the default first page (20 rows,
`include=usage`), a page deep in the list (a cursor half-way), each sort's first page, a cost
page deep by cursor, `q` (a common word, the commonest, an uncommon one, a rare one, two
words), `id` (a conversation's, a request's, an answer's), `user` (the user with the most
conversations, and a rare one), a metadata filter, a cost range, and a team key's first page.
Prints p50 and p95 in milliseconds, and the rows each found.

`--ui` then times the page too: a gateway served on each store (`gateway serve`, on the bench's
own CPUs), the conversation list opened in Debian's Chromium (Playwright, signed in with the
master key) until the first page's rows are drawn: the default list, a search (`q=water`,
`q=the`) and the heaviest user. Prints the p50 of `--ui-runs` in ms, opened from a blank page
(the app's code loaded too) and from another page of the app (its address changed).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import orjson

from bench.procs import free_port, port_open, spawn, wait_until
from gateway.config import StoreConfig
from gateway.conversations.listing import Cursor, ListQuery, list_conversations
from gateway.storage.backends import make_store
from gateway.storage.schema import _TOTALS_OF, SEARCHED_TYPES, sqlite_index_new_messages
from gateway.storage.store import Store

T0 = 1_780_000_000.0
SPAN_S = 90 * 86400
TEAMS = 40
USERS = 1_000
RARE = "zebrafish"  # in about one message in 5,000
_VOCABULARY = (
    "the of and to a in is it you that he was for on are with as I his they be at one have"
    " this from or had by not word but what some we can out other were all there when up use"
    " your how said an each she which do their time if will way about many then them write"
    " would like so these her long make thing see him two has look more day could go come"
    " did number sound no most people my over know water than call first who may down side"
    " been now find any new work part take get place made live where after back little only"
    " round man year came show every good me give our under name very through just form"
    " sentence great think say help low line differ turn cause much mean before move right"
    " boy old too same tell does set three want air well also play small end put home read"
    " hand port large spell add even land here must big high such follow act why ask men"
    " change went light kind off need house picture try us again animal point mother world"
    " near build self earth father head stand own page should country found answer school"
    " grow study still learn plant cover food sun four between state keep eye never last let"
    " thought city tree cross farm hard start might story saw far sea draw left late run"
    " while press close night real life few north open seem together next white children"
    " begin got walk example ease paper group always music those both mark often letter"
    " until mile river car feet care second book carry took science eat room friend began"
    " idea fish mountain stop once base hear horse cut sure watch color face wood main"
    " enough plain girl usual young ready above ever red list though feel talk bird soon"
    " body dog family direct pose leave song measure door product black short numeral class"
    " wind question happen complete ship area half rock order fire south problem piece told"
    " knew pass since top whole king space heard best hour better true during hundred five"
    " remember step early hold west ground interest reach fast verb sing listen six table"
    " travel less morning ten simple several vowel toward war lay against pattern slow"
    " center love person money serve appear road map rain rule govern pull cold notice voice"
    " unit power town fine certain fly fall lead cry dark machine note wait plan figure star"
    " box noun field rest correct able pound done beauty drive stood contain front teach"
    " week final gave green oh quick develop ocean warm free minute strong special mind"
    " behind clear tail produce fact street inch multiply nothing course stay wheel full"
    " force blue object decide surface deep moon island foot system busy test record boat"
    " common gold possible plane stead dry wonder laugh thousand ago ran check game shape"
    " equate hot miss brought heat snow tire bring yes distant fill east paint language"
    " among database query index latency token stream cache retry deploy server client"
    " request function error python invoice refund password account billing schedule meeting"
    " summary"
)
_WORDS = _VOCABULARY.split()
_WEIGHTS = [1.0 / (rank + 1) for rank in range(len(_WORDS))]


def _text(rng: random.Random, low: int, high: int) -> str:
    words = rng.choices(_WORDS, _WEIGHTS, k=rng.randint(low, high))
    if rng.random() < 0.0002:
        words.insert(rng.randrange(len(words)), RARE)
    sentences, start = [], 0
    while start < len(words):
        end = start + rng.randint(6, 14)
        sentences.append(" ".join(words[start:end]).capitalize() + ".")
        start = end
    return " ".join(sentences)


@dataclass
class Seed:
    conversations: list[tuple[Any, ...]] = field(default_factory=list)
    turns: list[tuple[Any, ...]] = field(default_factory=list)
    events: list[tuple[Any, ...]] = field(default_factory=list)
    usage: list[tuple[Any, ...]] = field(default_factory=list)
    # What the queries look for: a conversation's id, a request id, a user, the middle row.
    some_conversation: str = ""
    some_request: str = ""
    some_answer: str = ""
    middle: tuple[float, str] = (0.0, "")
    # Whose conversations are the most: the `user` filter's worst case, and how many.
    heavy_user: tuple[str, int] = ("", 0)


CONVERSATION_COLUMNS = ("id", "created_at", "team_id", "key_id", "metadata")
TURN_COLUMNS = (
    "id", "conversation_id", "started_at", "ended_at", "status", "request", "team_id",
    "key_id", "request_id", "user", "response_id",
)  # fmt: skip
EVENT_COLUMNS = ("conversation_id", "seq", "turn_id", "type", "created_at", "payload", "uid")
USAGE_COLUMNS = (
    "id", "turn_id", "conversation_id", "team_id", "key_id", "user", "alias", "deployment",
    "provider", "model", "created_at", "status", "prompt_tokens", "completion_tokens",
    "completion_delivered", "reasoning_tokens", "cached_tokens", "usage_source", "cost_usd",
    "ttft_ms", "duration_ms",
)  # fmt: skip


def seed(count: int) -> Seed:
    rng = random.Random(7)
    made = Seed()
    times = sorted(T0 + rng.random() * SPAN_S for _ in range(count))
    uid = 0
    per_user: dict[str, int] = {}
    for n, created in enumerate(times):
        cid = f"conv_{int(created * 1000):012x}{rng.getrandbits(40):010x}"
        team = f"team{rng.randrange(TEAMS)}"
        key = f"key_{team}_{rng.randrange(5)}"
        user = f"user{int(rng.paretovariate(1.2)) % USERS}"
        per_user[user] = per_user.get(user, 0) + 1
        metadata = None
        if rng.random() < 0.33:
            metadata = orjson.dumps(
                {"app": rng.choice(("web", "cli", "slack", "api", "mobile")), "env": "prod"}
            ).decode()
        made.conversations.append((cid, created, team, key, metadata))
        if n == count // 2:
            made.middle = (created, cid)
            made.some_conversation = cid
        at = created
        seq = 0
        for t in range(rng.choice((1, 1, 2, 2, 3))):
            turn = f"turn_{int(at * 1000):012x}{rng.getrandbits(40):010x}"
            request_id = f"{rng.getrandbits(64):016x}"
            answer_id = f"chatcmpl-{rng.getrandbits(96):024x}"
            if n == count // 3 and t == 0:
                made.some_request, made.some_answer = request_id, answer_id
            request = {
                "endpoint": "openai_chat", "request_id": request_id, "model": "gpt-4o-mini",
                "stream": True, "user": user, "instructions": [], "params": {"temperature": 0.7},
            }  # fmt: skip
            ttft = rng.lognormvariate(6.0, 0.6)
            duration = ttft + rng.lognormvariate(7.5, 0.8)
            status = "aborted" if rng.random() < 0.05 else "completed"
            ended = at + duration / 1000
            made.turns.append(
                (turn, cid, at, ended, status, orjson.dumps(request).decode(), team, key,
                 request_id, user, answer_id)
            )  # fmt: skip
            question = {"content": _text(rng, 8, 40)}
            answer = {
                "content": [{"type": "text", "text": _text(rng, 20, 120)}],
                "interrupted": status == "aborted", "surface_op": "append", "stream": [],
                "route": {"deployment": "openai/0", "provider": "openai"}, "attempt": 1,
                "finish_reason": "stop",
            }  # fmt: skip
            end = {"status": status, "reason": None, "attempts": 1, "duration_ms": duration}
            for kind, payload in (
                ("user/message", question),
                ("assistant/message", answer),
                ("turn/end", end),
            ):
                seq += 1
                uid += 1
                made.events.append(
                    (cid, seq, turn, kind, at, orjson.dumps(payload).decode(), f"u{uid}")
                )
            attempts = [("error", 0, 0.0)] if rng.random() < 0.05 else []
            prompt = rng.randint(50, 4000)
            completion = rng.randint(20, 800)
            attempts.append(("completed", completion, ttft))
            for number, (outcome, tokens, first) in enumerate(attempts, 1):
                cost = (prompt * 0.15 + tokens * 0.6) / 1e6
                made.usage.append(
                    (f"{turn}:{number}", turn, cid, team, key, user, "gpt-4o-mini", "openai/0",
                     "openai", "gpt-4o-mini", at, outcome, prompt, tokens, tokens, 0, 0,
                     "provider", cost, first or None, duration if tokens else 300.0)
                )  # fmt: skip
            at = ended + rng.random() * 600
    made.heavy_user = max(per_user.items(), key=lambda item: item[1])
    return made


def _insert(table: str, columns: tuple[str, ...]) -> str:
    names = ", ".join(f'"{c}"' for c in columns)
    return f"INSERT INTO {table} ({names}) VALUES ({', '.join('?' for _ in columns)})"


async def _migrated(url: str) -> None:
    store = make_store(StoreConfig(url=url, spool_path=tempfile.mkdtemp()), "bench")
    await store.start()
    await store.close()


async def fill_sqlite(path: Path, made: Seed) -> None:
    await _migrated(f"sqlite:///{path}")
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("BEGIN")
    db.executemany(_insert("conversations", CONVERSATION_COLUMNS), made.conversations)
    db.executemany(_insert("turns", TURN_COLUMNS), made.turns)
    db.executemany(_insert("events", EVENT_COLUMNS), made.events)
    uids = [event[6] for event in made.events if event[3] in SEARCHED_TYPES]
    for start in range(0, len(uids), 500):  # as the store's batches index what they insert
        some = uids[start : start + 500]
        db.execute(sqlite_index_new_messages(len(some)), some)
    db.executemany(_insert("usage", USAGE_COLUMNS), made.usage)
    db.execute(_TOTALS_OF)
    db.execute("COMMIT")
    db.close()


async def fill_postgres(url: str, made: Seed) -> None:
    await _migrated(url)
    conn = await asyncpg.connect(url)
    for table, columns, rows in (
        ("conversations", CONVERSATION_COLUMNS, made.conversations),
        ("turns", TURN_COLUMNS, made.turns),
        ("events", EVENT_COLUMNS, made.events),
        ("usage", USAGE_COLUMNS, made.usage),
    ):
        await conn.copy_records_to_table(table, records=rows, columns=list(columns))
    await conn.execute(_TOTALS_OF)
    await conn.execute("VACUUM ANALYZE")
    await conn.close()


def queries(made: Seed) -> Iterator[tuple[str, ListQuery]]:
    yield "default first page", ListQuery(with_usage=True)
    middle = Cursor("created", "desc", made.middle[0], made.middle[1])
    yield "a page deep (cursor half-way)", ListQuery(after=middle, with_usage=True)
    for sort in ("updated", "cost", "tokens", "duration", "ttft", "attempts"):
        yield f"sort={sort}", ListQuery(sort=sort, with_usage=True)
    yield "sort=cost&order=asc", ListQuery(sort="cost", order="asc", with_usage=True)
    deep = Cursor("cost", "desc", 0.0003, "conv_")
    yield "sort=cost, deep by cursor", ListQuery(sort="cost", after=deep, with_usage=True)
    yield "q=water (common)", ListQuery(q="water", with_usage=True)
    yield "q=the (the commonest)", ListQuery(q="the", with_usage=True)
    yield "q=summary (uncommon)", ListQuery(q="summary", with_usage=True)
    yield f"q={RARE} (rare)", ListQuery(q=RARE, with_usage=True)
    yield "q=invoice refund", ListQuery(q="invoice refund", with_usage=True)
    yield "id=<conversation>", ListQuery(id=made.some_conversation, lookup=made.some_conversation)
    yield "id=<request id>", ListQuery(id=made.some_request, lookup=made.some_request)
    yield "id=<response id>", ListQuery(id=made.some_answer, lookup=made.some_answer)
    heavy, conversations = made.heavy_user
    yield f"user={heavy} (heavy: {conversations:,})", ListQuery(user=heavy, with_usage=True)
    yield "user=user900 (rare)", ListQuery(user="user900", with_usage=True)
    yield "metadata.app=slack", ListQuery(metadata=(("app", "slack"),), with_usage=True)
    yield "metadata.app=none (no match)", ListQuery(metadata=(("app", "none"),), with_usage=True)
    yield (
        "min_cost=0.0005&max_cost=0.0006",
        ListQuery(ranges=(("min_cost", 0.0005), ("max_cost", 0.0006)), with_usage=True),
    )
    yield "team key, first page", ListQuery(team_id="team3", with_usage=True)
    yield (
        "team key, q=water, sort=cost",
        ListQuery(team_id="team3", q="water", sort="cost", with_usage=True),
    )


async def measure(store: Store, made: Seed, runs: int) -> list[tuple[str, float, float, int]]:
    results = []
    for name, query in queries(made):
        page = await list_conversations(store, query)  # warm-up
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            await list_conversations(store, query)
            times.append((time.perf_counter() - start) * 1000)
        times.sort()
        p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
        results.append((name, statistics.median(times), p95, len(page.data)))
    return results


async def bench(url: str, made: Seed, runs: int) -> list[tuple[str, float, float, int]]:
    store = make_store(StoreConfig(url=url, spool_path=tempfile.mkdtemp()), "bench")
    await store.start()
    try:
        return await measure(store, made, runs)
    finally:
        await store.close()


def report(name: str, results: list[tuple[str, float, float, int]]) -> None:
    print(f"\n{name}: ms, p50 / p95 (rows)")
    for query, p50, p95, rows in results:
        print(f"  {query:36} {p50:8.1f} {p95:8.1f}   ({rows})")


async def main(args: argparse.Namespace, pg_url: str | None) -> None:
    t = time.perf_counter()
    made = seed(args.conversations)
    print(
        f"made {len(made.conversations):,} conversations, {len(made.turns):,} turns,"
        f" {len(made.events):,} events, {len(made.usage):,} usage rows"
        f" in {time.perf_counter() - t:.0f} s"
    )
    if "sqlite" in args.backends:
        with tempfile.TemporaryDirectory(prefix="gw-list-") as where:
            path = Path(where) / "gateway.db"
            t = time.perf_counter()
            await fill_sqlite(path, made)
            size = path.stat().st_size / 2**20
            print(f"SQLite filled in {time.perf_counter() - t:.0f} s ({size:.0f} MiB)")
            report("SQLite", await bench(f"sqlite:///{path}", made, args.runs))
            if args.ui:
                report_ui("SQLite", await ui_times(f"sqlite:///{path}", made, args.ui_runs))
    if pg_url is not None:
        t = time.perf_counter()
        await fill_postgres(pg_url, made)
        print(f"PostgreSQL filled in {time.perf_counter() - t:.0f} s")
        report("PostgreSQL", await bench(pg_url, made, args.runs))
        if args.ui:
            report_ui("PostgreSQL", await ui_times(pg_url, made, args.ui_runs))


UI_MASTER = "sk-list-bench-master-key-0123456789"
CHROMIUM = "/usr/bin/chromium"  # Debian's, as tests/ui drives it
BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"]
ROWS = "[data-page=conversations] tr[data-conversation-id]"


def ui_pages(made: Seed) -> list[tuple[str, str]]:
    heavy, conversations = made.heavy_user
    return [
        ("first page", "#/conversations"),
        ("q=water (common)", "#/conversations?q=water"),
        ("q=the (the commonest)", "#/conversations?q=the"),
        (f"user={heavy} (heavy: {conversations:,})", f"#/conversations?user={heavy}"),
    ]


async def ui_times(url: str, made: Seed, runs: int) -> list[tuple[str, float, float]]:
    """Each page of `ui_pages` opened `runs` times after one warm-up, in a gateway served on
    the store at `url`: (page, p50 from a blank page to its rows drawn, p50 from another page
    of the app) in ms."""
    from playwright.async_api import async_playwright, expect

    where = Path(tempfile.mkdtemp(prefix="gw-list-ui-"))
    config = where / "gateway.yaml"
    spool = where / "spool"
    config.write_text(
        orjson.dumps(
            {
                "store": {"url": url, "spool_path": str(spool)},
                "auth": {"master_key": UI_MASTER},
                "models": [
                    {"name": "demo", "deployments": [{"provider": "demo", "price": "free"}]}
                ],
            }
        ).decode()
    )
    port = free_port()
    core = min(os.sched_getaffinity(0))
    argv = [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", str(port)]
    gateway = spawn("gateway", argv, core, where / "gateway.log", Path.cwd())
    results = []
    try:
        wait_until(gateway, lambda: port_open(port), timeout=120)
        base = f"http://127.0.0.1:{port}/ui/"
        async with async_playwright() as p:
            browser = await p.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=BROWSER_ARGS
            )
            page = await browser.new_page(viewport={"width": 1440, "height": 900})
            page.set_default_timeout(30_000)
            await page.goto(base)
            await page.get_by_test_id("login-key").fill(UI_MASTER)
            await page.get_by_test_id("login-submit").click()
            await expect(page.locator(ROWS).first).to_be_visible(timeout=30_000)
            for name, route in ui_pages(made):
                opened, moved = [], []
                for _ in range(runs + 1):
                    await page.goto("about:blank")
                    start = time.perf_counter()
                    await page.goto(base + route)
                    await expect(page.locator(ROWS).first).to_be_visible(timeout=30_000)
                    opened.append((time.perf_counter() - start) * 1000)
                    # Then within the app, its code loaded: from a page without rows.
                    await page.goto(base + "#/nowhere")
                    await expect(page.get_by_test_id("not-found")).to_be_visible()
                    start = time.perf_counter()
                    await page.evaluate("route => { location.hash = route }", route[1:])
                    await expect(page.locator(ROWS).first).to_be_visible(timeout=30_000)
                    moved.append((time.perf_counter() - start) * 1000)
                results.append((name, statistics.median(opened[1:]), statistics.median(moved[1:])))
            await browser.close()
    finally:
        gateway.stop()
    shutil.rmtree(where)  # kept, with the gateway's log, when something failed
    return results


def report_ui(name: str, results: list[tuple[str, float, float]]) -> None:
    print(f"\n{name}, the list page in Chromium: ms to its rows drawn, p50 opened / in the app")
    for page, opened, moved in results:
        print(f"  {page:36} {opened:8.1f} {moved:8.1f}")


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ui", action="store_true", help="time the list page in Chromium too")
    parser.add_argument("--ui-runs", type=int, default=5, help="times each page is opened")


def run_on_backends(
    description: str | None,
    bench: Callable[[argparse.Namespace, str | None], Coroutine[Any, Any, None]],
    prefix: str,
    options: Callable[[argparse.ArgumentParser], None] | None = None,
) -> None:
    """A bench's command line (its seed's size, runs, backends, a PostgreSQL URL, and the
    bench's own `options`), then the bench, with a throwaway PostgreSQL (its data directory
    named `prefix`...) unless given one or told to leave PostgreSQL out."""
    parser = argparse.ArgumentParser(description=description)
    if options is not None:
        options(parser)
    parser.add_argument("--conversations", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--url", help="an empty PostgreSQL database (default: a throwaway one)")
    args = parser.parse_args()
    if "postgresql" not in args.backends:
        asyncio.run(bench(args, None))
    elif args.url:
        asyncio.run(bench(args, args.url))
    else:
        from tests.postgres_server import throwaway_postgres

        with throwaway_postgres(prefix) as server:
            asyncio.run(bench(args, server.create_database()))


if __name__ == "__main__":
    run_on_backends(__doc__, main, "gw-list-", options)
