import os, sys, time
import narad
def handle(msg: narad.Message) -> None:  # payload {"sleep": s} works s seconds; {"fail": true} fails once
    job = msg.payload if isinstance(msg.payload, dict) else {}
    time.sleep(job.get("sleep", 0))
    if job.get("fail") and msg.delivery_count == 1: raise RuntimeError("failing once")
    print(f"done {msg.partition}/{msg.offset} delivery={msg.delivery_count}", flush=True)
client = narad.Client(os.environ["NARAD_URL"], os.environ["NARAD_USER"], os.environ["NARAD_PASS"])
narad.Worker(client, sys.argv[1], handle).run()
