"""A provider's usage report read as counts: the usual report, read the short way, gives what
reading every field gives, whatever the report holds."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.metering.usage import _checked_counts, checked_counts

COUNT = st.one_of(
    st.integers(min_value=-5, max_value=200),
    st.just(10**9),  # past any context window
    st.floats(min_value=-2, max_value=50, allow_nan=False),
    st.none(),
    st.booleans(),
    st.text(max_size=2),
)
PROMPT_DETAILS = st.dictionaries(
    st.sampled_from(
        ["cached_tokens", "audio_tokens", "cache_creation_tokens", "cache_creation_token_details"]
    ),
    COUNT,
)
COMPLETION_DETAILS = st.dictionaries(st.sampled_from(["reasoning_tokens", "audio_tokens"]), COUNT)
USAGE = st.dictionaries(
    st.sampled_from(
        [
            "prompt_tokens",
            "completion_tokens",
            "total_tokens",
            "cache_read_input_tokens",
            "cache_creation_input_tokens",
            "usage_source",
        ]
    ),
    COUNT,
).flatmap(
    lambda top: st.fixed_dictionaries(
        {},
        optional={
            "prompt_tokens_details": PROMPT_DETAILS,
            "completion_tokens_details": COMPLETION_DETAILS,
            "provider_usage": st.dictionaries(
                st.sampled_from(["input_tokens", "output_tokens", "cache_creation_input_tokens"]),
                COUNT,
            ),
            "cache_creation": st.dictionaries(
                st.sampled_from(["ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens"]), COUNT
            ),
        },
    ).map(lambda nested: {**top, **nested})
)


@settings(max_examples=400, deadline=None)
@given(USAGE)
def test_the_short_way_reads_what_every_field_reads(usage: dict[str, Any]) -> None:
    assert checked_counts(usage) == _checked_counts(usage)


def test_an_openai_report_with_reasoning_inside_the_completion() -> None:
    usage = {
        "prompt_tokens": 30,
        "completion_tokens": 120,
        "total_tokens": 150,
        "prompt_tokens_details": {"cached_tokens": 10, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 64, "audio_tokens": 0},
    }
    counts, wrong, prompt_wrong, completion_wrong = checked_counts(usage)
    assert (counts.prompt, counts.completion, counts.reasoning, counts.cached) == (30, 120, 64, 10)
    assert (wrong, prompt_wrong, completion_wrong) == ((), False, False)


def test_a_negative_count_is_caught_the_short_way_too() -> None:
    checked = checked_counts({"prompt_tokens": -3, "completion_tokens": 5, "total_tokens": 2})
    assert checked.wrong == ("prompt_tokens",)
    assert checked.prompt_wrong and not checked.completion_wrong
    assert checked.counts.prompt == 0
