"""Text normalisation for the offline understanding layer (pure, no I/O).

``tokens(text)`` lower-cases, splits on anything that is not a letter, digit or decimal
point, turns number words into digits ("twenty four" -> "24", "a couple of" -> "2") and
stems every word lightly, so "crashed", "crashes" and "crash" meet as one token.
The stemmer only has to be *consistent*: the concept lexicon is stemmed by the same
function when it is loaded, so a word and its inflections land on the same key.
"""

from __future__ import annotations

import re

UNITS = {
    "zero": 0, "one": 1, "single": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
    "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14,
    "fifteen": 15, "sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19, "dozen": 12,
}
TENS = {"twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80,
        "ninety": 90}
# Multi-word quantities, replaced before the word-by-word pass.
PHRASE_NUMBERS = (("half a dozen", "6"), ("a couple of", "2"), ("a couple", "2"), ("a pair of", "2"),
                  ("a dozen", "12"), ("a hundred", "100"), ("a single", "1"))

IRREGULAR = {
    "died": "die", "dies": "die", "dying": "die", "dead": "die", "ran": "run", "running": "run",
    "went": "go", "gone": "go", "going": "go", "broke": "break", "broken": "break", "paid": "paid",
    "using": "use", "used": "use", "uses": "use", "doing": "do", "does": "do", "did": "do", "done": "do",
    "has": "have", "had": "have", "having": "have", "is": "be", "are": "be", "was": "be", "were": "be",
    "lost": "lose", "hung": "hang", "shared": "share", "sharing": "share", "shares": "share",
    "spent": "spend", "got": "get", "gets": "get", "getting": "get", "made": "make", "makes": "make",
    "making": "make", "fitted": "fit", "fitting": "fit", "fits": "fit", "kept": "keep",
    "gpus": "gpu", "cpus": "cpu", "vms": "vm", "its": "it",
}
_NO_UNDOUBLE = set("lsz")
_TOKEN = re.compile(r"[a-z]+|\d+(?:\.\d+)?|\.\d+|[<>]=?")


def stem(word: str) -> str:
    """A light suffix stripper: plural/-ed/-ing, doubled consonants, a final 'e'."""
    word = IRREGULAR.get(word, word)
    if len(word) <= 3 or not word.isalpha():
        return word
    for suffix, repl in (("ies", "y"), ("ied", "y"), ("ing", ""), ("ed", ""), ("es", ""), ("s", "")):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            if suffix == "s" and word.endswith(("ss", "us", "is")):
                continue
            word = word[: -len(suffix)] + repl
            break
    if len(word) > 3 and word[-1] == word[-2] and word[-1] not in _NO_UNDOUBLE and word[-1] not in "aeiou":
        word = word[:-1]
    if len(word) > 3 and word.endswith("e"):
        word = word[:-1]
    return word


def words_to_numbers(words: list[str]) -> list[str]:
    """["twenty", "four", "hosts"] -> ["24", "hosts"]; plain digits pass through."""
    out: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word in TENS:
            value = TENS[word]
            if i + 1 < len(words) and words[i + 1] in UNITS and 0 < UNITS[words[i + 1]] < 10:
                value += UNITS[words[i + 1]]
                i += 1
            out.append(str(value))
        elif word in UNITS and word != "one":
            out.append(str(UNITS[word]))
        elif word == "one" and i + 1 < len(words) and words[i + 1] not in ("of", "that", "which"):
            out.append("1")  # "one node" -> 1; "one of the nodes" stays a word
        else:
            out.append(word)
        i += 1
    return out


def raw_words(text: str) -> list[str]:
    """Lower-cased words and numbers, number words turned into digits, not yet stemmed."""
    lowered = " " + re.sub(r"[\u2018\u2019']", "", text.lower().replace("-", " ")) + " "
    for phrase, digits in PHRASE_NUMBERS:
        lowered = lowered.replace(f" {phrase} ", f" {digits} ")
    return words_to_numbers(_TOKEN.findall(lowered))


def tokens(text: str) -> list[str]:
    """The stemmed token sequence that concepts are matched against."""
    return [stem(w) for w in raw_words(text)]


def stem_phrase(phrase: str) -> tuple[str, ...]:
    return tuple(tokens(phrase))
