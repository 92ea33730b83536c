"""What the Host tests share: an echo handler and a bounded wait for a condition."""
import asyncio


async def echo_handler(stream) -> None:
    """Send back what the stream brings until it ends, then close."""
    while True:
        data = await stream.read()
        if not data:
            break
        await stream.write(data)
    await stream.close()


async def until(predicate, timeout=5.0):
    """Poll ``predicate()`` every 20 ms; AssertionError when it is not true within ``timeout`` s."""
    for _ in range(int(timeout / 0.02)):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")
