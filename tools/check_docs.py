#!/usr/bin/env python3
"""Checks the README and docs/ as a reader meets them (ctest unit:docs): the README stays short
(at most MAX_README_LINES lines), opens with the app's screenshot, and every relative link or image
in README.md and docs/*.md names a file or folder that exists in the checkout (and, for a
markdown page, a heading the #anchor names).
usage: tools/check_docs.py [ROOT]   (ROOT: the checkout, default this script's parent folder)
       tools/check_docs.py --self-test   (the checker on made-up checkouts)"""
import pathlib
import re
import sys

MAX_README_LINES = 150
README_PICTURE = "docs/screenshots/app.png"
README_PICTURE_BY_LINE = 10

# [text](target) and ![alt](target), with an optional "title"; reference-style links are not used.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def links(text):
    """(line number, target) of each inline link outside fenced code blocks and code spans."""
    in_fence = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        for match in LINK.finditer(re.sub(r"`[^`]*`", "", line)):
            yield number, match.group(1)


def anchors(text):
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to '-'."""
    found, in_fence = set(), False
    for line in text.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def check(root):
    problems = []
    readme = root / "README.md"
    pages = [readme] + sorted((root / "docs").glob("*.md"))
    for page in pages:
        if not page.is_file():
            problems.append(f"{page.relative_to(root)}: missing")
            continue
        for number, target in links(page.read_text(encoding="utf-8")):
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
                continue  # http:, mailto: ...
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists():
                problems.append(f"{page.relative_to(root)}:{number}: link to '{target}': "
                                f"no file {resolved}")
            elif anchor and resolved.suffix == ".md" and \
                    anchor not in anchors(resolved.read_text(encoding="utf-8")):
                problems.append(f"{page.relative_to(root)}:{number}: link to '{target}': "
                                f"no heading '#{anchor}' in {resolved.name}")
    if readme.is_file():
        lines = readme.read_text(encoding="utf-8").splitlines()
        if len(lines) > MAX_README_LINES:
            problems.append(f"README.md: {len(lines)} lines; expected at most {MAX_README_LINES} "
                            "(move reference text into docs/)")
        first_image = next(((n, t) for n, t in links("\n".join(lines)) if t.endswith(".png")),
                           (0, None))
        if first_image[1] != README_PICTURE or first_image[0] > README_PICTURE_BY_LINE:
            problems.append(f"README.md: expected the app's screenshot, '{README_PICTURE}', "
                            f"within its first {README_PICTURE_BY_LINE} lines (first picture: "
                            f"'{first_image[1]}' on line {first_image[0]})")
    return problems


def self_test():
    """The checker on made-up checkouts: a good one passes, each fault is reported."""
    import tempfile
    good_readme = "# x\n\n![app](docs/screenshots/app.png)\n\nSee [cli](docs/cli.md#info).\n"
    cases = {
        "good": ({"README.md": good_readme}, []),
        "broken link": ({"README.md": good_readme + "[gone](docs/gone.md)\n"}, ["docs/gone.md"]),
        "broken image in docs": (
            {"README.md": good_readme, "docs/cli.md": "![v](screenshots/no.png)"},
            ["screenshots/no.png"]),
        "missing heading": ({"README.md": good_readme.replace("#info", "#nothing")},
                            ["no heading '#nothing'"]),
        "too long": ({"README.md": good_readme + "line\n" * MAX_README_LINES}, ["lines; expected"]),
        "no picture first": ({"README.md": "# x\n[cli](docs/cli.md)\n"}, ["app's screenshot"]),
        "links in code are not links": (
            {"README.md": good_readme + "```\n[a](nowhere.md)\n```\n`[b](nowhere.md)`\n"}, []),
    }
    failures = 0
    for name, (files, expected) in cases.items():
        with tempfile.TemporaryDirectory() as folder:
            root = pathlib.Path(folder)
            defaults = {"docs/cli.md": "# kvlens-cli\n\n## info\n", "docs/screenshots/app.png": ""}
            for path, text in {**defaults, **files}.items():
                (root / path).parent.mkdir(parents=True, exist_ok=True)
                (root / path).write_text(text)
            problems = check(root)
            ok = (not problems) if not expected else all(
                any(want in p for p in problems) for want in expected)
            if not ok:
                failures += 1
                print(f"check_docs --self-test: {name}: expected {expected or 'no problem'}, "
                      f"got {problems}", file=sys.stderr)
    print(f"check_docs --self-test: {len(cases) - failures} of {len(cases)} cases right")
    return 1 if failures else 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent)
    problems = check(root.resolve())
    for problem in problems:
        print(f"check_docs: {problem}", file=sys.stderr)
    if not problems:
        print("check_docs: README.md and docs/*.md: every relative link resolves")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
