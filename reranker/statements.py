"""Primary financial statements named by a question and titled on a page.

A question that says "basing your judgment on the balance sheet" or "according
to the statement of cash flows" wants that statement's page, and a filing titles
it in its first lines ("CONSOLIDATED BALANCE SHEETS", "Consolidated Statements
of Financial Position"). The words differ (a balance sheet is a statement of
financial position, an income statement a statement of operations or of
earnings), so neither BM25 nor the bi-encoder ties them reliably, and the same
words run through the notes ("see the Consolidated Balance Sheets") where they
are not a title. The page side therefore matches whole title lines only.
"""

from __future__ import annotations

import re

# statement family -> how a question names it (on lower-cased text)
_QUESTION_NAMES = {
    "balance": r"balance\s+sheets?|statements?\s+of\s+financial\s+(?:position|condition)",
    "income": (r"income\s+statements?|statements?\s+of\s+(?:consolidated\s+)?(?:income|operations|earnings)"
               r"|\bp\s*&\s*l\b|profit\s+and\s+loss"),
    "comprehensive": r"statements?\s+of\s+comprehensive\s+(?:income|loss)",
    "cash": r"cash\s+flows?\s+statements?|statements?\s+of\s+cash\s+flows?",
    "equity": r"statements?\s+of\s+(?:stockholders|shareholders|changes\s+in)\W*\s*(?:equity|deficit)",
}
# statement family -> its title, on a line lower-cased with everything but letters
# and "&" removed (PDF extraction splits words: "Balance Shee t", "Cash Flow s")
_TITLES = {
    "balance": r"balancesheets?|statements?offinancial(?:position|condition)",
    # "Statements of Operations and Comprehensive Loss" is both statements in one
    "income": (r"incomestatements?|statements?of(?:consolidated)?(?:income|operations|earnings)"
               r"(?:andcomprehensive(?:income|loss)(?:loss)?)?|profitandloss"),
    "comprehensive": (r"statements?ofcomprehensive(?:income|loss)"
                      r"|statements?of(?:consolidated)?(?:income|operations|earnings)andcomprehensive(?:income|loss)(?:loss)?"),
    "cash": r"cashflows?statements?|statements?ofcashflows?",
    "equity": r"statements?of(?:stockholders|shareholders|changesin)(?:equity|deficit)",
}
_TITLE_LINE = {family: re.compile(r"(?:consolidated|combined)?(?:" + title + r")(?:continued)?")
               for family, title in _TITLES.items()}
_QUESTION_NAME = {family: re.compile(pattern) for family, pattern in _QUESTION_NAMES.items()}
_WORDY_LINE = re.compile(r"[^\W\d_]{3}")
_HEADING_LINES = 8  # a title sits above the table, after a running header or two
_INDEX_FAMILIES = 3  # a page titled as three statements at once is an index of them


def named_statements(question: str) -> frozenset[str]:
    """The statement families the question names."""
    text = question.lower()
    return frozenset(family for family, pattern in _QUESTION_NAME.items() if pattern.search(text))


def titled_statements(page_text: str) -> frozenset[str]:
    """The statement families whose title is a whole line among the page's first
    lines with words (lines of table rules or figures are skipped). A line with a
    figure is an index entry ("Consolidated Balance Sheets 54"), not a title."""
    found = set()
    lines = [line for line in (page_text or "").split("\n") if _WORDY_LINE.search(line)][:_HEADING_LINES]
    for line in lines:
        if any(c.isdigit() for c in line):
            continue
        squeezed = re.sub(r"[^a-z&]", "", line.lower())
        for family, title in _TITLE_LINE.items():
            if title.fullmatch(squeezed):
                found.add(family)
    return frozenset(found) if len(found) < _INDEX_FAMILIES else frozenset()
