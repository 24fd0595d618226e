"""PostgreSQL access: connections and the embedded server (db), migrations, the snapshot extract.  May import core."""
