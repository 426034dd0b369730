-- acquire: take the lock, or re-enter it, or report who is in the way.
--
-- KEYS[1]  the lock hash          (field = holder id, value = hold count)
-- KEYS[2]  the fence counter      (last token; lives while the lock is held
--                                  and `window` ms after, see below)
-- ARGV[1]  holder id              ("<process-uuid>:<n>", unique per hold)
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  window in milliseconds (how long the counter outlives the lock)
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
-- between any two), far more than a microsecond apart.
--
-- So the counter only matters while the clock could still be at or below the
-- last token: just after it was issued, or after the clock stepped back. It
-- expires `window` after the lock was last held (the TTL is lease + window,
-- set here and by every renewal, and cut to the window by a release), so a
-- key locked once costs nothing for good. A later first acquisition reads the
-- clock at least `window` after the last token was issued, and that reading
-- is above the token unless the clock stepped back by more than the window.
-- A counter left without a TTL by an older version of these scripts is read
-- like any other and gets its TTL here.
local lease = tonumber(ARGV[2])
local keep = lease + tonumber(ARGV[3])
if redis.call('exists', KEYS[1]) == 0 then
  local fence = tonumber(redis.call('get', KEYS[2]) or '0') + 1
  local now = redis.call('time')
  local clock = tonumber(now[1]) * 1000000 + tonumber(now[2])
  if clock > fence then
    fence = clock
  end
  redis.call('set', KEYS[2], string.format('%.0f', fence), 'px', keep)
  redis.call('hset', KEYS[1], ARGV[1], 1)
  redis.call('pexpire', KEYS[1], lease)
  return {1, fence}
end
if redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
  redis.call('hincrby', KEYS[1], ARGV[1], 1)
  redis.call('pexpire', KEYS[1], lease)
  redis.call('pexpire', KEYS[2], keep)
  return {1, tonumber(redis.call('get', KEYS[2]) or '0')}
end
return {0, redis.call('pttl', KEYS[1])}
