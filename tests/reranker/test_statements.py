"""reranker/statements.py: a financial statement named by a question, titled on a page."""

from evidentia.reranker.features import PAGE_FEATURE_NAMES, lexical_features, query_terms
from evidentia.reranker.statements import item_statements, named_statements, titled_statements

BALANCE_SHEET = """Table of Contents
3M Company and Subsidiaries
Consolidated Balance Shee t
At December 31
(Dollars in millions, except per share amount)
Assets
Cash and cash equivalents 2,853 3,053
Accounts payable 2,266 1,945"""

FINANCIAL_POSITION = """The Boeing Company and Subsidiaries
Consolidated Statements of Financial Position
(Dollars in millions, except per share data)
December 31, 2018 2017"""

NOTE_MENTIONING_IT = """NOTES TO CONSOLIDATED FINANCIAL STATEMENTS
Note 4. Inventories
Inventories shown in the Consolidated Balance Sheets are stated at the lower of cost or market.
The components are as follows."""

INDEX_PAGE = """INDEX TO CONSOLIDATED FINANCIAL STATEMENTS
Report of Independent Registered Public Accounting Firm 50
Consolidated Statements of Operations 52
Consolidated Balance Sheets 54
Consolidated Statements of Cash Flows 55"""

CASH_FLOWS_AFTER_TABLE_RULES = """| | | |
| | 52 | |
Consolidated Statements of Cash Flow s (continued)
GENERAL MILLS, INC. AND SUBSIDIARIES
(In Millions)"""


def test_questions_name_statements_in_their_own_words():
    assert named_statements("Basing your judgments off of the balance sheet, what is AP?") == {"balance"}
    assert named_statements("According to the statement of financial position, ...") == {"balance"}
    assert named_statements("Using the P&L statement and the statement of cash flows") == {"income", "cash"}
    assert named_statements("What is FY2019 revenue per the income statement?") == {"income"}
    assert named_statements("Refer to the statement of comprehensive income") == {"comprehensive"}
    assert named_statements("What drove the change in operating margin?") == frozenset()
    # "cash flow" alone is a measure, not the statement
    assert named_statements("What was the operating cash flow in 2022?") == frozenset()


def test_a_page_titled_as_a_statement_is_found_in_other_words_and_broken_words():
    assert titled_statements(BALANCE_SHEET) == {"balance"}
    assert titled_statements(FINANCIAL_POSITION) == {"balance"}
    assert titled_statements(CASH_FLOWS_AFTER_TABLE_RULES) == {"cash"}


def test_a_mention_in_running_text_or_an_index_line_with_a_page_number_is_not_a_title():
    assert titled_statements(NOTE_MENTIONING_IT) == frozenset()
    assert titled_statements(INDEX_PAGE) == frozenset()
    assert titled_statements("") == frozenset()


def test_statement_title_feature_needs_both_sides():
    column = PAGE_FEATURE_NAMES.index("statement_title") - 4  # lexical_features start at cov_question
    asks = query_terms("Basing your judgments off of the balance sheet, what is year-end accounts payable?", "$303")
    other = query_terms("What is year-end accounts payable?", "$303")
    cash = query_terms("According to the statement of cash flows, what is capex?", "")
    assert lexical_features(asks, FINANCIAL_POSITION)[column] == 1.0
    assert lexical_features(asks, NOTE_MENTIONING_IT)[column] == 0.0
    assert lexical_features(other, FINANCIAL_POSITION)[column] == 0.0
    assert lexical_features(cash, FINANCIAL_POSITION)[column] == 0.0


def test_an_index_of_statements_on_separate_lines_is_not_a_title():
    index = "INDEX TO FINANCIAL STATEMENTS\nConsolidated Statements of Operations\nConsolidated Balance Sheets\nConsolidated Statements of Cash Flows\n52\n54\n55"
    assert titled_statements(index) == frozenset()


def test_a_quarterly_reports_condensed_statements_and_a_statement_of_equity_are_titles():
    assert titled_statements("Amcor plc and Subsidiaries\nCondensed Consolidated Balance Sheets\n(Unaudited)") == {"balance"}
    assert titled_statements("PFIZER INC.\nCONDENSED CONSOLIDATED STATEMENTS OF CASH FLOWS\n(UNAUDITED)") == {"cash"}
    assert titled_statements("Amcor plc and Subsidiaries\nConsolidated Statements of Equity\n($ in millions)") == {"equity"}
    assert titled_statements("Best Buy\nCondensed Consolidated Statements of Changes in Shareholders' Equity") == {"equity"}
    # the guarantors' supplementary statements are not the company's
    assert titled_statements("MGM\nCONDENSED CONSOLIDATING BALANCE SHEET INFORMATION\nDecember 31") == frozenset()


def test_a_title_broken_over_two_lines_is_read_whole():
    assert titled_statements("3M Company\nConsolidated\nBalance Sheets\n(Dollars in millions)") == {"balance"}
    # a column header that ends in a statement's name is not its title
    header = ("Table of Contents\nOffsetting of Financial Assets under Master Netting Agreements\n"
              "Gross Amount of Derivative Assets\nPresented in the Consolidated\nBalance Sheet\nForeign exchange")
    assert titled_statements(header) == frozenset()


def test_a_statement_heading_a_table_after_running_text_is_not_the_statement():
    guarantors = ("The summarized financial information of us and our guarantor subsidiaries, on a combined basis, "
                  "is presented below.\nDecember 31,\nBalance Sheet\n(In thousands)\nCurrent assets")
    assert titled_statements(guarantors) == frozenset()


def test_a_contents_page_with_page_numbers_on_their_own_lines_is_not_a_title():
    contents = ("PART IV\nITEM 15. EXHIBITS, FINANCIAL STATEMENT SCHEDULES\n(a)(1). Financial Statements.\n"
                "Reports of Independent Registered Public Accounting Firm\nYears Ended December 31, 2022\n"
                "Consolidated Statements of Operations\nConsolidated Statements of Comprehensive Income\n"
                "Consolidated Statements of Cash Flows\nConsolidated Statements of Stockholders' Equity\n55\n56\n57")
    assert titled_statements(contents) == frozenset()


def test_a_combined_statement_is_both():
    page = "AMD\nConsolidated Statements of Operations and Comprehensive Loss\n(In millions)"
    assert titled_statements(page) == {"income", "comprehensive"}


def test_a_line_item_points_to_the_statements_that_print_it():
    assert item_statements("Did the company grow its PP&E between FY20 and FY21?") == {"balance"}
    assert item_statements("Which of operating, investing and financing activities brought in the most cash?") == {"cash"}
    assert item_statements("What drove the change in gross margin?") == {"income"}
    assert item_statements("What is the FY2018 return on assets?") == {"income", "balance"}
    assert item_statements("Is the business subject to cyclicality?") == frozenset()
    # the statements print totals; a breakdown is in the segment note
    assert item_statements("Which product categories represent more than 20% of revenue?") == frozenset()
    assert item_statements("Which geographic region had the biggest drop in revenues?") == frozenset()
    assert item_statements("What were Scope 1 emissions in 2023?") == frozenset()


def test_statement_item_feature_needs_the_item_and_the_title():
    column = PAGE_FEATURE_NAMES.index("statement_item") - 4  # lexical_features start at cov_question
    inventories = query_terms("What were year-end inventories?", "")
    margin = query_terms("What drove the change in operating margin?", "")
    assert lexical_features(inventories, FINANCIAL_POSITION)[column] == 1.0
    assert lexical_features(inventories, NOTE_MENTIONING_IT)[column] == 0.0
    assert lexical_features(margin, FINANCIAL_POSITION)[column] == 0.0
    # a named statement is its own feature; the two are independent
    named = query_terms("Basing your judgments off of the balance sheet, what is year-end accounts payable?", "$303")
    assert lexical_features(named, FINANCIAL_POSITION)[column - 1:column + 1] == [1.0, 1.0]
