"""Clean exit, in one room: `criteria` (what a question freezes), `judge` (the verdict over every
leg it covers), `canaries` (a passing receipt set and one planted error per rule), `legs` (the
legs a question calls for). Its receipts are the `processes` every leg.json records
(`tica.receipts.ProcessExit`, written by tica.leg_run and the producers), and one process's exit
rule is shared with throughput (`tica.process_exits`): both are core. Its producer is
tica/legs/clean_exit.py, a process of its own like every producer."""
