-- TypeORM (the migration `typeorm migration:generate` writes, PostgresDriver with
-- uuidExtension "pgcrypto"): entities `Job` and `Report`, `@OneToOne(() => Job) @JoinColumn()`
-- on the report (a nullable "jobId" with a unique constraint and a foreign key). Ids are
-- @PrimaryGeneratedColumn("uuid") and a SERIAL; the status an enum column, a PostgreSQL enum
-- named after table and column; @CreateDateColumn/@UpdateDateColumn are timestamp without time
-- zone defaulting to now(), in the server's zone (UTC here). Constraint names are TypeORM's
-- hashes of the table and columns.
--
--   @Entity() export class Job {
--     @PrimaryGeneratedColumn("uuid") id: string;
--     @Column({ type: "enum", enum: ["queued", "running", "done", "failed"], default: "queued" })
--     status: string;
--     @Column({ type: "text", nullable: true }) document: string | null;
--     @Column({ type: "jsonb", nullable: true }) findings: object | null;
--     @CreateDateColumn() createdAt: Date;
--     @UpdateDateColumn() updatedAt: Date;
--   }
--   @Entity() export class Report {
--     @PrimaryGeneratedColumn() id: number;
--     @Column({ type: "jsonb" }) findings: object;
--     @OneToOne(() => Job) @JoinColumn() job: Job;
--   }
CREATE TYPE "public"."job_status_enum" AS ENUM('queued', 'running', 'done', 'failed');
CREATE TABLE "job" ("id" uuid NOT NULL DEFAULT gen_random_uuid(), "status" "public"."job_status_enum" NOT NULL DEFAULT 'queued', "document" text, "findings" jsonb, "createdAt" TIMESTAMP NOT NULL DEFAULT now(), "updatedAt" TIMESTAMP NOT NULL DEFAULT now(), CONSTRAINT "PK_98ab1c14ff8d1cf80d18703b92f" PRIMARY KEY ("id"));
CREATE TABLE "report" ("id" SERIAL NOT NULL, "findings" jsonb NOT NULL, "jobId" uuid, CONSTRAINT "REL_3c4a1f0e5b8d2c6a9e7f1b0d4c" UNIQUE ("jobId"), CONSTRAINT "PK_99e4d0bea58cba73c57f935a546" PRIMARY KEY ("id"));
ALTER TABLE "report" ADD CONSTRAINT "FK_3c4a1f0e5b8d2c6a9e7f1b0d4c2" FOREIGN KEY ("jobId") REFERENCES "job"("id") ON DELETE NO ACTION ON UPDATE NO ACTION;
