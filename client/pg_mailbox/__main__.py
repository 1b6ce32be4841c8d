from pg_mailbox.cli import main

raise SystemExit(main())
