-- acquire: take the lock, or re-enter it, or report who is in the way.
--
-- KEYS[1]  the lock hash          (field = holder id, value = hold count;
--                                  field 'fence' = the hold's token)
-- KEYS[2]  the fence counter      (last token of the key; expires `window`
--                                  after it was issued, see below)
-- ARGV[1]  holder id              ("<process-uuid>:<n>", unique per hold)
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  window in milliseconds
-- ARGV[4]  tokens to reserve for local holders (lock cohorting; '0': none)
--
-- returns  {1, fence, upto}  held: the lock is ours (first acquisition or
--                            re-entry); tokens fence+1..upto are reserved
--                            for holders this process passes it to
--          {0, pttl}         busy: another holder has it for pttl more milliseconds
--
-- Redlock passes one more key and three more arguments, the master's boot
-- marker (see redlock_boot.lua):
--
-- KEYS[3]  the boot marker        (hash: 'since', 'until', 'lease'; no TTL)
-- ARGV[5]  quarantine in milliseconds (the caller's: its longest lease known,
--          padded) for a master found to have lost its data
-- ARGV[6]  the longest TTL in milliseconds the caller knows any master gave
--          (the 'lease' of a marker created here)
-- ARGV[7]  '1': a retake by a holder that a majority just renewed, which may
--          take a quarantined master (no one else can hold a majority now)
--
-- and every reply gets the marker's 'lease' as a fourth element (a busy
-- reply's third is 0); two more:
--
--          {-1, left, 0, lease}  quarantined for left more milliseconds: the
--                                master lost its data less than a lease ago
--          {-2, left, 0, lease}  the same, found just now: the marker was
--                                missing (and is created, quarantined)
--
-- The boot marker is checked before this script's first line:
-- redlock_boot_check.lua is prepended to it at load (redis/scripts.rs); with
-- KEYS[3] given it answers the two replies above itself, and otherwise
-- leaves the marker's 'lease' in `recorded` (nil when no marker is given)
-- for the replies below.

-- Fencing tokens: every first acquisition takes max(counter + 1, server time
-- in microseconds). Counting up alone is not enough: a Redis restored from an
-- older snapshot, or a replica promoted before it saw the last increments,
-- holds a counter below tokens already handed out. The clock is past all of
-- them as long as tokens never run ahead of it, and they do not: one key's
-- acquisitions are serialised by the lock (a release and an acquire script
-- between any two), far more than a microsecond apart.
--
-- So the counter only matters while the clock could still be at or below the
-- last token, and it expires `window` after that token was issued: a key
-- locked once costs nothing for good. The next first acquisition that finds
-- no counter reads the clock at least `window` after the last token was
-- issued, above that token unless the clock stepped back by more than the
-- window. The hold keeps its own token in the hash, for a re-entry that
-- comes after the counter expired. A counter without a TTL, left by an
-- earlier version of these scripts, is read like any other and gets one here.
--
-- Reserved tokens: the counter is set to the last token of the block, so
-- every later acquisition's token is above all of them. They run at most
-- the reserve (at most 1000) microseconds ahead of the clock, and the next
-- acquisition comes a release or a lease expiry later: the clock argument
-- above still holds for it.
if redis.call('exists', KEYS[1]) == 0 then
  local fence = tonumber(redis.call('get', KEYS[2]) or '0') + 1
  local now = redis.call('time')
  local clock = tonumber(now[1]) * 1000000 + tonumber(now[2])
  if clock > fence then
    fence = clock
  end
  local token = string.format('%.0f', fence)
  local upto = fence + (tonumber(ARGV[4]) or 0)
  redis.call('set', KEYS[2], string.format('%.0f', upto), 'px', ARGV[3])
  redis.call('hset', KEYS[1], ARGV[1], 1, 'fence', token)
  redis.call('pexpire', KEYS[1], ARGV[2])
  return {1, fence, upto, recorded}
end
if redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
  redis.call('hincrby', KEYS[1], ARGV[1], 1)
  redis.call('pexpire', KEYS[1], ARGV[2])
  -- (A hold taken by an earlier version has no 'fence' field: its token is
  -- the counter's.)
  local fence = tonumber(redis.call('hget', KEYS[1], 'fence') or redis.call('get', KEYS[2]) or '0')
  return {1, fence, fence, recorded}
end
return {0, redis.call('pttl', KEYS[1]), 0, recorded}
