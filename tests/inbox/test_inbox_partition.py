"""inbox_is_my_partition (SPEC §3.2): every aggregate has exactly one owner."""

import threading

import pytest
from mbx import drop_role, make_role, raises, rows, scalar


def test_every_aggregate_belongs_to_exactly_one_worker_for_1_to_16_workers(db):
    # hashtext() includes negative values and INT_MIN-adjacent ones: abs() on bigint is exact
    got = rows(
        db,
        """
        WITH agg AS (SELECT 'agg-' || i AS id FROM generate_series(1, 2000) AS i
                     UNION ALL SELECT '' UNION ALL SELECT 'ünïcode')
        SELECT n, agg.id, count(*) FILTER (WHERE mailbox.inbox_is_my_partition(agg.id, w, n))
          FROM generate_series(1, 16) AS n CROSS JOIN agg
          CROSS JOIN LATERAL generate_series(0, n - 1) AS w
         GROUP BY n, agg.id""",
    )
    assert len(got) == 16 * 2002
    assert {r[2] for r in got} == {1}
    # and the work is spread: with 4 workers each gets a share
    shares = rows(
        db,
        """SELECT w, count(*) FROM generate_series(1, 2000) AS i,
                                generate_series(0, 3) AS w
                          WHERE mailbox.inbox_is_my_partition('agg-' || i, w, 4) GROUP BY w""",
    )
    assert len(shares) == 4 and all(300 < r[1] < 700 for r in shares)


def test_the_formula_is_the_documented_one(db):
    assert scalar(
        db,
        """SELECT bool_and(mailbox.inbox_is_my_partition(x, w, 7)
                                         = (abs(hashtext(x)::bigint) % 7 = w))
                           FROM (SELECT md5(i::text) AS x FROM generate_series(1, 500) AS i) AS a,
                                generate_series(0, 6) AS w""",
    )


@pytest.mark.parametrize("worker, total", [(0, 0), (0, -1), (-1, 4), (4, 4), (5, 4)])
def test_bad_worker_numbers_are_22023(db, worker, total):
    with raises("22023") as info:
        db.execute("SELECT mailbox.inbox_is_my_partition('a', %s, %s)", [worker, total])
    assert info.value.diag.message_hint


def test_nulls(db):
    with raises("22004"):
        db.execute("SELECT mailbox.inbox_is_my_partition('a', NULL, 4)")
    with raises("22004"):
        db.execute("SELECT mailbox.inbox_is_my_partition('a', 0, NULL)")
    assert scalar(db, "SELECT mailbox.inbox_is_my_partition(NULL, 0, 4)") is None


def test_attributes(db):
    assert tuple(
        rows(
            db,
            """SELECT provolatile, proparallel FROM pg_proc
                              WHERE oid = 'mailbox.inbox_is_my_partition(text, int, int)'
                                         ::regprocedure""",
        )[0]
    ) == ("i", "s")


def test_four_workers_claiming_only_their_partition_process_everything_once(db, connect):
    db.execute("SELECT mailbox.create_inbox('parts')")
    db.execute("""INSERT INTO mailbox.parts (event_id, payload, aggregate_id)
                  SELECT 'm' || i, '{}', 'agg-' || (i % 97) FROM generate_series(1, 600) AS i""")
    db.execute("CREATE TABLE public.handled (event_id text, aggregate_id text, worker int)")
    # the workers are plain consumers: they lock their rows in the inbox table (consumers
    # have SELECT, UPDATE on managed inbox tables) and mark through the API
    role = make_role(db, "mailbox_consumer")
    db.execute(f'GRANT INSERT ON public.handled TO "{role}"')
    conns = [connect(autocommit=False) for _ in range(4)]
    for conn in conns:
        conn.execute(f'SET ROLE "{role}"')
        conn.commit()
    barrier = threading.Barrier(4)
    errors = []

    def worker(w):
        conn = conns[w]
        try:
            barrier.wait(timeout=10)
            while True:
                batch = rows(
                    conn,
                    """
                    SELECT event_id, aggregate_id FROM mailbox.parts
                     WHERE processed_at IS NULL AND retry_count < 3
                       AND mailbox.inbox_is_my_partition(aggregate_id, %s, 4)
                     ORDER BY received_at LIMIT 10 FOR UPDATE SKIP LOCKED""",
                    [w],
                )
                if not batch:
                    conn.commit()
                    return
                for event_id, aggregate_id in batch:
                    conn.execute(
                        "INSERT INTO public.handled VALUES (%s, %s, %s)",
                        [event_id, aggregate_id, w],
                    )
                    assert (
                        scalar(conn, "SELECT mailbox.inbox_mark_processed('parts', %s)", [event_id])
                        is True
                    )
                conn.commit()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert scalar(db, "SELECT count(*) FROM public.handled") == 600
    assert scalar(db, "SELECT count(DISTINCT event_id) FROM public.handled") == 600
    # each aggregate was handled by one worker only, and every worker had work
    assert (
        scalar(
            db,
            "SELECT max(n) FROM (SELECT count(DISTINCT worker) AS n FROM public.handled"
            " GROUP BY aggregate_id) AS x",
        )
        == 1
    )
    assert scalar(db, "SELECT count(DISTINCT worker) FROM public.handled") == 4
    assert scalar(db, "SELECT count(*) FROM mailbox.pending_parts") == 0
    for conn in conns:
        conn.close()
    db.execute("DROP TABLE public.handled")
    drop_role(db, role)
