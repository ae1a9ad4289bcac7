-- GORM (gorm.io/driver/postgres, as `db.AutoMigrate(&Transcode{}, &Rendition{})` sends it):
-- `Transcode` has one `Rendition`. Both embed gorm.Model (a bigserial id, created_at,
-- updated_at and deleted_at as timestamptz, nullable, set by GORM; deleted_at indexed: soft
-- deletes on both tables). The status is an int16 constant, smallint; the findings
-- datatypes.JSON, JSONB. The rendition's TranscodeID is `gorm:"uniqueIndex;not null"`, and the
-- has-one relation makes the foreign key fk_transcodes_rendition.
--
--   type Transcode struct {
--       gorm.Model
--       Status    int16 `gorm:"not null;default:0"` // 0 queued, 1 running, 2 done, 3 failed
--       Document  *string
--       Findings  datatypes.JSON
--       Rendition *Rendition
--   }
--   type Rendition struct {
--       gorm.Model
--       TranscodeID uint           `gorm:"uniqueIndex;not null"`
--       Findings    datatypes.JSON `gorm:"not null"`
--   }
CREATE TABLE "transcodes" ("id" bigserial,"created_at" timestamptz,"updated_at" timestamptz,"deleted_at" timestamptz,"status" smallint NOT NULL DEFAULT 0,"document" text,"findings" JSONB,PRIMARY KEY ("id"));
CREATE INDEX IF NOT EXISTS "idx_transcodes_deleted_at" ON "transcodes" ("deleted_at");

CREATE TABLE "renditions" ("id" bigserial,"created_at" timestamptz,"updated_at" timestamptz,"deleted_at" timestamptz,"transcode_id" bigint NOT NULL,"findings" JSONB NOT NULL,PRIMARY KEY ("id"),CONSTRAINT "fk_transcodes_rendition" FOREIGN KEY ("transcode_id") REFERENCES "transcodes"("id"));
CREATE INDEX IF NOT EXISTS "idx_renditions_deleted_at" ON "renditions" ("deleted_at");
CREATE UNIQUE INDEX IF NOT EXISTS "idx_renditions_transcode_id" ON "renditions" ("transcode_id");
