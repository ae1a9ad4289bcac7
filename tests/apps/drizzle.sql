-- Drizzle (drizzle-orm/pg-core, the migration `drizzle-kit generate` writes): `jobs` and
-- `reports`, the report's job_id unique and referencing the job (a one-to-one `relations`).
-- uuid ids with defaultRandom(); the status a text with TypeScript's enum only; timestamps
-- with time zone and defaultNow(); the report's own serial key.
--
--   export const jobs = pgTable("jobs", {
--     id: uuid("id").primaryKey().defaultRandom(),
--     status: text("status", { enum: ["queued", "running", "done", "failed"] })
--       .notNull().default("queued"),
--     document: text("document"),
--     findings: jsonb("findings"),
--     createdAt: timestamp("created_at", { withTimezone: true }).notNull().defaultNow(),
--     updatedAt: timestamp("updated_at", { withTimezone: true }).notNull().defaultNow(),
--   });
--   export const reports = pgTable("reports", {
--     id: serial("id").primaryKey(),
--     jobId: uuid("job_id").notNull().unique().references(() => jobs.id),
--     findings: jsonb("findings").notNull(),
--     createdAt: timestamp("created_at", { withTimezone: true }).notNull().defaultNow(),
--   });
CREATE TABLE "jobs" (
	"id" uuid PRIMARY KEY DEFAULT gen_random_uuid() NOT NULL,
	"status" text DEFAULT 'queued' NOT NULL,
	"document" text,
	"findings" jsonb,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
CREATE TABLE "reports" (
	"id" serial PRIMARY KEY NOT NULL,
	"job_id" uuid NOT NULL,
	"findings" jsonb NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "reports_job_id_unique" UNIQUE("job_id")
);
--> statement-breakpoint
ALTER TABLE "reports" ADD CONSTRAINT "reports_job_id_jobs_id_fk" FOREIGN KEY ("job_id") REFERENCES "public"."jobs"("id") ON DELETE no action ON UPDATE no action;
