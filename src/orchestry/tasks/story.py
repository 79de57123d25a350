"""Story writing under stated constraints as a two-turn episode: ``writer`` drafts, ``editor`` delivers the story.

Every constraint is verified in code, IFEval-style (Zhou et al. 2023, arXiv 2311.07911: instructions whose
compliance a program can check), on the latest story (the writer's draft, the editor's when finished):

- ``length``: the story (title line excluded) has between ``min_words`` and ``max_words`` words;
- ``words``: the share of the required words used (case-insensitive, whole words, a plural ``s``/``es``
  allowed);
- ``pov``: the requested point of view. Narration is the text outside double quotes. *first*: at least two
  first-person singular pronouns (I, me, my, mine, myself) in the narration; *third*: none of those or of
  we/us/our in the narration and at least two third-person pronouns (he, she, they, him, her, them, his,
  their...);
- ``title``: a title wrapped in double angular brackets on a line of its own, ``<<The Lost Key>>`` (IFEval's
  title instruction), and, when the spec names one, that exact title (case-insensitive).

Reward = the weighted sum of the parts (``api_grpo.story`` weights; max = their sum, 4.0 by default). The
optional LLM judge (``api_grpo.judge``) scores coherence and style on top, as for the code tasks.

The specs are generated (:func:`story_specs`): a topic, ``required_words`` words and a point of view per spec,
drawn with ``api_grpo.story.seed``; train and test specs are drawn from disjoint topic lists, so the
evaluation never repeats a training topic.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestry.tasks.common import Turn, checked_result_line, finished, next_message, part_weights
from orchestry.tasks.text_checks import (
    compression_ratio,
    copied_share,
    distinct_n,
    is_real_sentence,
    sentences,
)

if TYPE_CHECKING:
    from orchestry.config import ApiGrpoStoryParams
    from orchestry.sandbox import Sandbox

WRITER_SYSTEM = "You are a writer of very short stories who follows every instruction exactly."
EDITOR_SYSTEM = "You are an editor who makes a story meet every stated constraint and returns only the story."

TRAIN_TOPICS = (
    "a lighthouse keeper's last night", "a robot learning to bake bread", "two friends lost in a snowstorm",
    "a cat that guards a library", "a letter that arrives fifty years late", "a child's first kite",
    "a market on the moon", "a clock that runs backwards", "a fisherman and a silver fish",
    "a door in the middle of a field", "a garden that grows at night", "the last train of the day",
    "a painter who cannot see blue", "a dragon afraid of fire", "a village without music",
    "a map drawn by a bird", "a shoemaker's strange customer", "a storm over the harbour",
    "a bicycle that remembers", "an umbrella shop in the desert",
)  # fmt: skip
TEST_TOPICS = (
    "a bridge built in one night", "a teacher's hidden talent", "a key found in the snow",
    "a river that changes course", "a mountain that sings", "a baker's rival",
    "a ship in a bottle that sails", "a radio that hears tomorrow", "a forest that moves",
    "a window to another city",
)  # fmt: skip
WORDS = (
    "lantern", "river", "whisper", "copper", "garden", "thunder", "mirror", "ladder", "orange", "feather",
    "candle", "harbor", "silver", "winter", "bridge", "secret", "violin", "marble", "window", "compass",
    "meadow", "puzzle", "anchor", "velvet", "rocket", "pepper", "castle", "shadow", "basket", "pillow",
)  # fmt: skip
POVS = ("first", "third")

_TITLE = re.compile(r"^\s*<<([^<>\n]+)>>\s*$", re.MULTILINE)
_WORD = re.compile(r"[A-Za-z0-9]+(?:['’-][A-Za-z0-9]+)*")
_QUOTED = re.compile(r"\"[^\"]*\"|“[^”]*”")
FIRST_SINGULAR = ("i", "me", "my", "mine", "myself")
FIRST_PLURAL = ("we", "us", "our", "ours", "ourselves")
THIRD = ("he", "she", "they", "him", "her", "them", "his", "hers", "their", "theirs", "himself", "herself",
         "themselves")  # fmt: skip


@dataclass(frozen=True)
class StorySpec:
    """One story to write: the constraints and the instruction text (``prompt``, what the judge sees too)."""

    task_id: str
    topic: str
    words: tuple[str, ...]
    pov: str
    min_words: int
    max_words: int
    title: str = ""  # "" = any title

    @property
    def prompt(self) -> str:
        pov = (
            "in the first person (the narrator says I)"
            if self.pov == "first"
            else "in the third person (no I or we outside dialogue)"
        )
        words = ", ".join(f'"{w}"' for w in self.words)
        title = f"<<{self.title}>>" if self.title else "<<...>>"
        return (
            f"Write a short story about {self.topic}.\nConstraints:\n"
            f"- between {self.min_words} and {self.max_words} words (title not counted);\n"
            + (f"- use the words {words};\n" if self.words else "")
            + f"- write it {pov};\n"
            f"- start with a title on its own line in double angular brackets, like {title}."
        )


def story_specs(
    n: int, split: str, required_words: int, min_words: int, max_words: int, seed: int = 0
) -> list[StorySpec]:
    """``n`` specs for ``split`` (``train``/``test``: disjoint topic lists), deterministic given ``seed``.

    Raises:
        ValueError: unknown split, ``n < 1``, more required words than the word list holds, or an empty range.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be train or test, got {split!r}")
    if n < 1 or not 0 <= required_words <= len(WORDS) or not 1 <= min_words <= max_words:
        raise ValueError(
            f"bad story spec request: n={n}, required_words={required_words}, words {min_words}-{max_words}"
        )
    topics = TRAIN_TOPICS if split == "train" else TEST_TOPICS
    rng = random.Random(f"story:{split}:{seed}")
    out = []
    for i in range(n):
        topic = topics[i % len(topics)] if i < len(topics) else rng.choice(topics)
        out.append(
            StorySpec(
                f"Story/{split}/{i}",
                topic,
                tuple(rng.sample(WORDS, required_words)),
                rng.choice(POVS),
                min_words,
                max_words,
            )
        )
    return out


# ---- the checks ------------------------------------------------------------------------------------------------
def split_title(text: str) -> tuple[str | None, str]:
    """``(title, body)``: the first ``<<title>>`` line (``None`` without one) and the text without it."""
    m = _TITLE.search(text or "")
    if m is None:
        return None, (text or "").strip()
    return m.group(1).strip(), ((text or "")[: m.start()] + (text or "")[m.end() :]).strip()


def words_of(text: str) -> list[str]:
    """The words of ``text`` (letters/digits, inner apostrophes and hyphens kept), lower-case."""
    return [w.lower() for w in _WORD.findall(text or "")]


def uses_word(text: str, word: str) -> bool:
    """``word`` occurs as a whole word (case-insensitive), a plural ``s``/``es`` allowed."""
    return re.search(rf"\b{re.escape(word)}(?:s|es)?\b", text or "", re.IGNORECASE) is not None


def pov_counts(text: str) -> dict[str, int]:
    """Pronoun counts in the narration (text outside double quotes): first singular/plural, third."""
    narration = _QUOTED.sub(" ", text or "")
    ws = words_of(narration)
    return {
        "first_singular": sum(w in FIRST_SINGULAR for w in ws),
        "first_plural": sum(w in FIRST_PLURAL for w in ws),
        "third": sum(w in THIRD for w in ws),
    }


def pov_ok(text: str, pov: str) -> bool:
    """The story is told in ``pov`` (``first``/``third``; see the module docstring)."""
    c = pov_counts(text)
    if pov == "first":
        return c["first_singular"] >= 2
    if pov == "third":
        return c["first_singular"] == 0 and c["first_plural"] == 0 and c["third"] >= 2
    raise ValueError(f"point of view must be first or third, got {pov!r}")


def prose_score(text: str, all_words: int) -> tuple[float, str]:
    """``(score, reason)``: how much of a story is real, non-repetitive prose (1.0 for a normal story).

    ``text`` is the story's real sentences (:func:`orchestry.tasks.text_checks.is_real_sentence`), ``all_words``
    the word count of the whole body. The score is the product of: the share of the body's words in real
    sentences (full at 80 %), distinct word bigrams (full at 0.85, 0 at 0.6) and the zlib compression ratio of
    the prose (full at 0.35, 0 at 0.2): keyword salad, lists and repeated sentences score near 0.
    """
    ws = words_of(text)
    if not ws:
        return 0.0, "prose: no real sentence"
    real = min(1.0, len(ws) / max(all_words, 1) / 0.8)
    d2 = distinct_n(ws, 2)
    rep = min(1.0, max(0.0, (d2 - 0.6) / 0.25))
    cr = compression_ratio(text)
    comp = min(1.0, max(0.0, (cr - 0.2) / 0.15))
    score = real * rep * comp
    if score >= 1.0:
        return 1.0, ""
    return score, (
        f"prose: {score:.2f} ({len(ws)} of {all_words} words in real sentences, distinct bigrams {d2:.2f}, "
        f"compression {cr:.2f})"
    )


def _story_text(answer: str) -> str:
    """The story in an answer: the text without a surrounding ``` fence. A preamble ('Here is...') is kept: it
    counts as story words (``length``) and is what the ``editor_preamble`` feature sees."""
    text = (answer or "").strip()
    fenced = re.fullmatch(r"```[a-zA-Z]*\n(.*?)\n?```", text, re.DOTALL)
    return fenced.group(1).strip() if fenced else text


class Story:
    """Writer -> editor (two turns); reward: the checked constraints, weighted (max = sum of the weights)."""

    name = "story"
    roles = ("writer", "editor")
    reward_parts = ("length", "words", "pov", "title")
    judge_criteria = (
        "QUALITY: is the final story coherent, well written and true to the requested topic?\n"
        "COLLABORATION: does the editor build on the writer's draft and fix what breaks the constraints?\n"
        "EFFICIENCY: is the work done with few, short, focused answers?\n"
    )

    def __init__(self, params: ApiGrpoStoryParams | None = None):
        if params is None:
            from orchestry.config import ApiGrpoStoryParams

            params = ApiGrpoStoryParams()
        self.params = params
        self.weights = part_weights(params, self.reward_parts)
        self.max_reward = sum(self.weights.values())
        self.feature_guides: dict[str, tuple[str, str | None, str | None]] = {
            "writer_words": (
                "writer",
                "Write a longer draft (top episodes: about {top:.0f} words, others {bottom:.0f}).",
                "Write a shorter draft (top episodes: about {top:.0f} words, others {bottom:.0f}).",
            ),
            "editor_words": (
                "editor",
                "Keep more of the story (top episodes: about {top:.0f} words, others {bottom:.0f}).",
                "Cut the story down (top episodes: about {top:.0f} words, others {bottom:.0f}).",
            ),
            "editor_has_title": ("editor", "Start with the title line in double angular brackets.", None),
            "writer_has_title": ("writer", "Start with the title line in double angular brackets.", None),
            "editor_preamble": (
                "editor",
                "Say briefly what you changed before the story.",
                "Answer with the story only: no introduction or comments.",
            ),
            "editor_changed": (
                "editor",
                "Revise the draft where it breaks a constraint.",
                "Keep the writer's draft unless it breaks a constraint.",
            ),
            "editor_uses_quotes": ("editor", "Include a line of dialogue.", "Avoid dialogue."),
        }

    # ---- items -------------------------------------------------------------------------------------------------
    def items(self, train: Sequence, test: Sequence) -> tuple[list[StorySpec], list[StorySpec]]:
        """The generated specs (the code problems the stage reads are not used by this task)."""
        p = self.params
        return (
            story_specs(p.train_prompts, "train", p.required_words, p.min_words, p.max_words, p.seed),
            story_specs(p.test_prompts, "test", p.required_words, p.min_words, p.max_words, p.seed),
        )

    # ---- prompts -----------------------------------------------------------------------------------------------
    def messages(
        self, problem: StorySpec, turns: Sequence[Turn], behaviors: Mapping[str, str]
    ) -> tuple[str, str]:
        """``(system, user)`` for the next agent of ``writer -> editor``.

        Raises:
            ValueError: the episode is already finished.
        """
        if not turns:
            return next_message(self, turns, behaviors, WRITER_SYSTEM, problem.prompt)
        if len(turns) == 1:
            user = (
                f"{problem.prompt}\n\nThe writer's draft:\n{turns[0].text.strip()}\n\n"
                "Edit the draft so that it meets every constraint. Answer with the final story only, "
                "title line first."
            )
            return next_message(self, turns, behaviors, EDITOR_SYSTEM, user)
        raise finished(self, turns)

    # ---- reward ------------------------------------------------------------------------------------------------
    def check(self, spec: StorySpec, answer: str) -> dict:
        """The checked constraints of one story: each part in [0, 1] (before weighting), ``prose`` (the fluency
        factor, 0-1), the weighted ``total`` (the parts' weighted sum times ``prose``), the word count of the
        real prose and ``reasons`` (what failed). A story that copies the prompt scores 0."""
        title, body = split_title(_story_text(answer))
        copied = copied_share(body, [spec.prompt], 4)
        real = [s for s in sentences(body) if is_real_sentence(s, 3, spec.words)]
        real = [s for s in real if copied_share(s, [spec.prompt], 4) < 0.5]
        text = " ".join(real)
        n = len(words_of(text))
        all_words = len(words_of(body))
        reasons = []
        length = float(spec.min_words <= n <= spec.max_words)
        if not length:
            reasons.append(f"length: {n} words of prose, need {spec.min_words}-{spec.max_words}")
        missing = [w for w in spec.words if not uses_word(text, w)]
        words = 1.0 - len(missing) / len(spec.words) if spec.words else 1.0
        if missing:
            reasons.append("words: not used in a sentence " + ", ".join(missing))
        pov = float(bool(text) and pov_ok(text, spec.pov))
        if not pov:
            reasons.append(f"pov: not {spec.pov} person ({pov_counts(text)})")
        title_ok = title is not None and (not spec.title or title.lower() == spec.title.lower())
        if not title_ok:
            reasons.append(
                "title: no <<title>> line" if title is None else f"title: {title!r} is not requested"
            )
        parts = {"length": length, "words": words, "pov": pov, "title": float(title_ok)}
        prose, why = prose_score(text, all_words)
        if why:
            reasons.append(why)
        if copied > self.params.copy_max:
            prose = 0.0
            reasons.append(f"copied: {copied:.0%} of the story repeats the prompt")
        factor = prose if self.params.prose_gate else 1.0
        total = factor * sum(self.weights[k] * v for k, v in parts.items())
        return {**parts, "prose": prose, "total": total, "word_count": n, "reasons": reasons}

    def score(
        self,
        problems: Sequence[StorySpec],
        transcripts: Sequence[Sequence[Turn]],
        sandbox: Sandbox | None = None,
    ) -> list[dict]:
        """Checked constraints of the latest story (the writer's, or the editor's when finished); no code runs."""
        return [self.check(p, t[-1].text if t else "") for p, t in zip(problems, transcripts, strict=True)]

    def result_line(self, reward: Mapping) -> str:
        """What the judge is told about the checked reward."""
        return checked_result_line(reward, self.reward_parts, self.max_reward)

    def features(self, problem: StorySpec, turns: Sequence[Turn], reward: Mapping) -> dict[str, float]:
        """Length, title, preamble and dialogue of the answers; whether the editor changed the draft."""
        writer, editor = turns[0], turns[1]
        w_title, w_body = split_title(_story_text(writer.text))
        e_title, e_body = split_title(_story_text(editor.text))
        first_line = _story_text(editor.text).splitlines()[0] if editor.text.strip() else ""
        return {
            "writer_words": float(len(words_of(w_body))),
            "editor_words": float(len(words_of(e_body))),
            "writer_has_title": float(w_title is not None),
            "editor_has_title": float(e_title is not None),
            "editor_preamble": float(bool(first_line) and _TITLE.match(first_line) is None),
            "editor_changed": float(" ".join(words_of(e_body)) != " ".join(words_of(w_body))),
            "editor_uses_quotes": float(bool(_QUOTED.search(e_body))),
            "writer_truncated": float(writer.truncated),
            "editor_truncated": float(editor.truncated),
            "outcome_length": float(reward.get("length", 0)),
            "outcome_pov": float(reward.get("pov", 0)),
        }
