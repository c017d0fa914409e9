"""Primary financial statements named by a question and titled on a page.

A question that says "basing your judgment on the balance sheet" or "according
to the statement of cash flows" wants that statement's page, and a filing titles
it in its first lines ("CONSOLIDATED BALANCE SHEETS", "Consolidated Statements
of Financial Position"). The words differ (a balance sheet is a statement of
financial position, an income statement a statement of operations or of
earnings), so neither BM25 nor the bi-encoder ties them reliably, and the same
words run through the notes ("see the Consolidated Balance Sheets") where they
are not a title. The page side therefore matches whole title lines only.

Most questions do not name the statement but ask for a line item printed on its
face ("Did Pfizer grow its PPNE?", "Which activities brought in the most cash
flow?"): ``item_statements`` maps those items to the statements that carry them.
That is a hint of another kind than a named statement (the same figure is also
discussed in the MD&A and the notes), so it is a feature of its own.
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
    # "Statements of Equity", "… of Shareholders' Equity", "… of Changes in Shareholders' Equity"
    "equity": r"statements?of(?:changesin)?(?:stockholders|shareholders)?(?:equity|deficit)",
}
# line items (and ratios built from them) -> the statements whose face prints them,
# on lower-cased question text; from the standard US GAAP / IFRS layouts, written
# after reading the training split's questions ("PPNE"), never the held-out ones
_LINE_ITEMS = (
    (r"cash\s+flows?|(?:operating|investing|financing)\s+activities|capital\s+expenditures?|\bcapex\b"
     r"|dividends?\s+paid|purchases?\s+of\s+property|depreciation\s+(?:and|&)\s+amortization|\bd\s*&\s*a\b",
     ("cash",)),
    (r"total\s+(?:current\s+)?(?:assets|liabilities)|current\s+(?:assets|liabilities)|working\s+capital"
     r"|(?:current|quick)\s+ratio|inventor(?:y|ies)|accounts\s+(?:payable|receivable)"
     r"|property,?\s+plant,?\s+(?:and|&)\s+equipment|\bpp\s*&\s*e\b|\bppne\b|fixed\s+assets"
     r"|cash\s+(?:and|&)\s+(?:cash\s+)?equivalents|goodwill|(?:total|long[\s-]term|short[\s-]term)\s+debt"
     r"|(?:shareholders|stockholders)\W*\s+equity|total\s+equity|book\s+value|retained\s+earnings"
     r"|debt[\s-]to[\s-](?:equity|capital)",
     ("balance",)),
    (r"revenues?|net\s+sales|total\s+sales|top\s+line|cost\s+of\s+(?:goods\s+sold|sales|revenues?)|\bcogs\b"
     r"|gross\s+(?:profit|margin)|operating\s+(?:income|profit|margin|expenses?|loss)"
     r"|selling,?\s+general|\bsg\s*&\s*a\b|research\s+and\s+development\s+expenses?"
     r"|net\s+(?:income|earnings|profit|loss)|bottom\s+line|earnings\s+per\s+share|\beps\b|\bebit(?:da)?\b"
     r"|interest\s+expense|income\s+tax(?:es)?\s+(?:expense|provision)|provision\s+for\s+income\s+taxes"
     r"|effective\s+tax\s+rate|income\s+before\s+(?:income\s+)?taxes|pre[\s-]?tax\s+income",
     ("income",)),
    (r"return\s+on\s+(?:assets|equity|invested\s+capital)|\bro(?:a|e|ic)\b|(?:asset|inventory)\s+turnover"
     r"|days\s+(?:inventory|sales|payables?)", ("income", "balance")),
    (r"(?:dividend|cash)\s+payout|free\s+cash\s+flow\s+(?:margin|conversion)", ("cash", "income")),
)
_LINE_ITEM = [(re.compile(pattern), families) for pattern, families in _LINE_ITEMS]
# The statements print consolidated totals: a breakdown of an item (by segment,
# region, product category) is in the segment note and the MD&A instead.
_BREAKDOWN = re.compile(r"\bsegments?\b|categor(?:y|ies)|\bregions?\b|regional|geograph|product\s+lines?"
                        r"|business\s+units?|\bdivisions?\b")
# a quarterly report titles its statements "Condensed Consolidated …"
_TITLE_LINE = {family: re.compile(r"(?:condensed)?(?:consolidated|combined)?(?:" + title + r")(?:continued)?")
               for family, title in _TITLES.items()}
_QUESTION_NAME = {family: re.compile(pattern) for family, pattern in _QUESTION_NAMES.items()}
_WORDY_LINE = re.compile(r"[^\W\d_]{3}")
_HEADING_LINES = 8  # a title sits above the table, after a running header or two
_INDEX_FAMILIES = 3  # a page titled as three statements at once is an index of them
# A statement's face opens with its title: a line this long is running text, and a
# "Balance Sheet" after it heads a note's table (a guarantor's summary), not the statement.
_PROSE_WORDS = 15
# A line ending so is cut mid-phrase: the next line is read with it ("Presented in the
# Consolidated" + "Balance Sheet" is a column header; "Consolidated" + "Balance Sheets" a title).
_CUT_LINE = re.compile(r"(?:\b(?:the|in|of|and|on|to|from|within)|consolidated|condensed|combined)\s*$", re.IGNORECASE)


def named_statements(question: str) -> frozenset[str]:
    """The statement families the question names."""
    text = question.lower()
    return frozenset(family for family, pattern in _QUESTION_NAME.items() if pattern.search(text))


def item_statements(question: str) -> frozenset[str]:
    """The statement families that print a line item the question asks about (none
    when it asks for the item's breakdown)."""
    text = question.lower()
    if _BREAKDOWN.search(text):
        return frozenset()
    return frozenset(family for pattern, families in _LINE_ITEM if pattern.search(text) for family in families)


def _title_families(line: str) -> set[str]:
    squeezed = re.sub(r"[^a-z&]", "", line.lower())
    return {family for family, title in _TITLE_LINE.items() if title.fullmatch(squeezed)}


def titled_statements(page_text: str) -> frozenset[str]:
    """The statement families whose title is a whole line among the page's first
    lines with words (lines of table rules or figures are skipped), before any
    running text. A line with a figure is an index entry ("Consolidated Balance
    Sheets 54"), not a title; so is a page with three statements' titles anywhere
    (a contents page whose page numbers sit on lines of their own)."""
    found: set[str] = set()
    wordy = [line for line in (page_text or "").split("\n") if _WORDY_LINE.search(line)]
    previous = ""
    for line in wordy[:_HEADING_LINES]:
        if len(line.split()) >= _PROSE_WORDS:
            break
        if not any(c.isdigit() for c in line):
            found |= _title_families(previous + " " + line if _CUT_LINE.search(previous) else line)
        previous = line
    if not found:
        return frozenset()
    everywhere = set().union(*(_title_families(line) for line in wordy if not any(c.isdigit() for c in line)))
    return frozenset(found) if len(found | everywhere) < _INDEX_FAMILIES else frozenset()
