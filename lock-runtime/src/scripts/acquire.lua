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
-- The fencing token is max(last token + 1, server time in microseconds), so it
-- keeps increasing even when the counter is lost with the data (Redis restarted
-- empty, no persistence): the clock carries the order across the restart.
if redis.call('exists', KEYS[1]) == 0 then
  local now = redis.call('time')
  local micros = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local last = tonumber(redis.call('get', KEYS[2]) or '0')
  local fence = math.max(last + 1, micros)
  redis.call('set', KEYS[2], string.format('%.0f', fence))
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
