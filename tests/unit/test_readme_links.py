"""README.md links only what the repository holds: every relative link resolves to a file
or folder of the checkout (none reaches outside it, like ../shared/...)."""
from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def relative_links(text: str) -> list[str]:
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    return [t.split("#", 1)[0] for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def test_readme_links_stay_in_the_repository():
    with open(os.path.join(ROOT, "README.md")) as f:
        links = relative_links(f.read())
    assert "docs/architecture.md" in links
    for link in links:
        path = os.path.normpath(os.path.join(ROOT, link))
        assert path.startswith(ROOT + os.sep), f"README links outside the repository: {link}"
        assert os.path.exists(path), f"README links a missing file: {link}"


def test_the_check_sees_a_bad_link():
    links = relative_links("see [design](../shared/design/architecture.md), [x](https://a.b/c), [y](#top)")
    assert links == ["../shared/design/architecture.md"]
    assert not os.path.normpath(os.path.join(ROOT, links[0])).startswith(ROOT + os.sep)
