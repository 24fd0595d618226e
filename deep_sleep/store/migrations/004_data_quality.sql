-- Results of the great-expectations suite over the whole store, once per night (SPEC §4).
CREATE TABLE data_quality_runs (
    id              uuid PRIMARY KEY,
    nightly_run_id  uuid,
    checked_at      timestamptz NOT NULL DEFAULT now(),
    success         boolean NOT NULL,
    failures        jsonb NOT NULL DEFAULT '[]'::jsonb,
    results_path    text NOT NULL,
    data_docs_path  text
);
CREATE INDEX data_quality_runs_checked ON data_quality_runs (checked_at DESC);
