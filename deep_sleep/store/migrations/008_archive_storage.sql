-- Before-images in consolidation_archive are written on every apply and read only by an undo.
-- Rows with an embedding (a vector as JSON text, ~3 KB) were pglz-compressed on the way in, which
-- cost 4–5 ms for a quick nap's 50 archived events; stored out of line uncompressed it is ~1 ms
-- (lz4 would be the better trade, but the embedded server is built without it).  Existing rows
-- keep their storage; new ones are written uncompressed.
ALTER TABLE consolidation_archive ALTER COLUMN row SET STORAGE EXTERNAL;
