-- Ecto (ecto_sql's Postgres adapter, as `mix ecto.migrate` sends it): `Analysis` and its
-- `AnalysisReport` (`has_one`; the report's analysis_id a unique index and a reference that
-- deletes with the analysis). @primary_key {:id, :binary_id, autogenerate: true}: uuid ids the
-- client makes, so no column default. The status is a PostgreSQL enum the migration creates with
-- `execute` (an Ecto.Enum over it in the schema). `timestamps()` are :naive_datetime,
-- timestamp(0) without time zone in UTC, set by Ecto, with inserted_at for created_at.
--
--   execute "CREATE TYPE analysis_status AS ENUM ('queued', 'running', 'completed', 'failed')"
--   create table(:analyses, primary_key: false) do
--     add :id, :binary_id, primary_key: true
--     add :status, :analysis_status, null: false, default: "queued"
--     add :document, :text
--     add :findings, :map
--     timestamps()
--   end
--   create table(:analysis_reports, primary_key: false) do
--     add :id, :binary_id, primary_key: true
--     add :analysis_id, references(:analyses, type: :binary_id, on_delete: :delete_all),
--       null: false
--     add :findings, :map, null: false
--     timestamps()
--   end
--   create unique_index(:analysis_reports, [:analysis_id])
CREATE TYPE analysis_status AS ENUM ('queued', 'running', 'completed', 'failed');

CREATE TABLE "analyses" ("id" uuid, "status" analysis_status DEFAULT 'queued' NOT NULL, "document" text, "findings" jsonb, "inserted_at" timestamp(0) NOT NULL, "updated_at" timestamp(0) NOT NULL, PRIMARY KEY ("id"));

CREATE TABLE "analysis_reports" ("id" uuid, "analysis_id" uuid NOT NULL CONSTRAINT "analysis_reports_analysis_id_fkey" REFERENCES "analyses"("id") ON DELETE CASCADE, "findings" jsonb NOT NULL, "inserted_at" timestamp(0) NOT NULL, "updated_at" timestamp(0) NOT NULL, PRIMARY KEY ("id"));

CREATE UNIQUE INDEX "analysis_reports_analysis_id_index" ON "analysis_reports" ("analysis_id");
