"""Plain helpers the tests share, by job: `stores` (store files and PostgreSQL databases),
`launches` (free ports, ranks started in processes, the scripts folder), `processes` (stopping
one), `logger_helpers` (a logger's launches and its store read back), `ui_browser` (a served page
in a real Chromium), `page_pixels`, `page_agreement`, `doc_blocks` (the docs' python blocks run),
and the stores and rows more than one test module builds: `logged_calls`, `built_stores`,
`planted_rows`, `ui_store`, `places_store`, `ledger_store`, `new_user_store`, `exported_rows`,
`row_batches`, `kept_verdict`, `held_reads`, `nothing_lost`. Fixtures and pytest hooks stay in
tests/conftest.py, which imports from here; a test imports from here, never from conftest.py or
from another test module."""
