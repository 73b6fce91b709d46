"""The study engine: a study's definition (`definition`), its runs (`runs`), its command line (`run`), its claims
and decision rules (`claims`), the report's tables and figures (`report`, `figures`) and the rerun check (`compare`)."""
