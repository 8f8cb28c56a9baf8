"""One rule for message content -> text (core/shapes.content_text), applied the same way by ingest (a quarantined
record when content is not text) and by the verifiers' completion parser (a parse error)."""

from __future__ import annotations

import pytest

from pivot_assets.core.shapes import ContentError, content_text
from pivot_assets.ingest.formats.messages import content_text as ingest_text
from pivot_assets.ingest.formats.records import RecordError
from pivot_assets.verifiers.parsing import ParseError, _content_text as completion_text

TEXT_CASES = [
    (None, None),
    ("plain", "plain"),
    (["a", "b"], "ab"),
    ([{"type": "text", "text": "a"}, {"type": "output_text", "text": "b"}], "ab"),
    ([{"type": "refusal", "refusal": "I can't"}], "I can't"),
]
NOT_TEXT = [
    [{"type": "image_url", "image_url": {"url": "x"}}],
    [{"type": "text", "text": "a"}, {"type": "input_audio", "input_audio": {}}],
    [3],
    {"text": "a dict, not a list"},
    7,
]


@pytest.mark.parametrize("content,text", TEXT_CASES)
def test_text_content_reads_the_same_in_ingest_and_in_the_verifiers(content, text):
    assert content_text(content) == text
    assert ingest_text(content, "m[0]") == text
    assert completion_text(content) == (text or "")


@pytest.mark.parametrize("content", NOT_TEXT)
def test_other_content_is_refused_by_both_never_dropped(content):
    with pytest.raises(ContentError):
        content_text(content)
    with pytest.raises(RecordError, match=r"^wrong_type: m\[0\]: (unsupported content part|content is)"):
        ingest_text(content, "m[0]")
    with pytest.raises(ParseError, match="message content"):
        completion_text(content)
