import json, os, psycopg2

conn = psycopg2.connect(os.environ["ETL_DATABASE_URL"])
with conn, conn.cursor() as cur:  # one transaction: the import's row and its task
    cur.execute("INSERT INTO imports (file) VALUES (%s) RETURNING id", ("a.csv",))
    cur.execute("SELECT data_manager.submit('import_file', %s::jsonb, idempotency_key => %s)",
                (json.dumps({"import": cur.fetchone()[0]}), "import-a.csv"))
    print(cur.fetchone()[0])
