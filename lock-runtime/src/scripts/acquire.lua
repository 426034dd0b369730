-- acquire: take the lock, or re-enter it, or report who is in the way.
--
-- KEYS[1]  the lock hash          (field = holder id, value = hold count)
-- KEYS[2]  the fence counter      (never expires; survives every release)
-- ARGV[1]  holder id              ("<process-uuid>:<n>", unique per hold)
-- ARGV[2]  lease in milliseconds
--
-- returns  {1, fence}  held: the lock is ours (first acquisition or re-entry)
--          {0, pttl}   busy: another holder has it for pttl more milliseconds
--
-- Fencing tokens: every first acquisition takes max(counter + 1, server time
-- in microseconds). Counting up alone is not enough: a Redis restored from an
-- older snapshot, or a replica promoted before it saw the last increments,
-- holds a counter below tokens already handed out. The clock is past all of
-- them as long as tokens never run ahead of it, and they do not: one key's
-- acquisitions are serialised by the lock (a release and an acquire script
-- between any two), far more than a microsecond apart. So the token only
-- grows as long as the server's clock does not step back by more than the
-- time since the last token (and, after a failover, the new primary's clock
-- is not behind the old one's by more than that).
if redis.call('exists', KEYS[1]) == 0 then
  local fence = redis.call('incr', KEYS[2])
  local now = redis.call('time')
  local clock = tonumber(now[1]) * 1000000 + tonumber(now[2])
  if clock > fence then
    fence = clock
    redis.call('set', KEYS[2], string.format('%.0f', fence))
  end
  redis.call('hset', KEYS[1], ARGV[1], 1)
  redis.call('pexpire', KEYS[1], ARGV[2])
  return {1, fence}
end
if redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
  redis.call('hincrby', KEYS[1], ARGV[1], 1)
  redis.call('pexpire', KEYS[1], ARGV[2])
  return {1, tonumber(redis.call('get', KEYS[2]) or '0')}
end
return {0, redis.call('pttl', KEYS[1])}
