from e2mc.cli import main

raise SystemExit(main())
