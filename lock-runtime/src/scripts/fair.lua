-- fair: first come, first served acquire and release, with direct handoff,
-- for write (exclusive) and read holds; a writer queued keeps later readers
-- out.
--
-- KEYS[1]  the lock hash          (a write hold as in acquire.lua: holder id
--                                  -> hold count, 'fence' -> the hold's token;
--                                  a read hold as in read.lua: 'mode' -> 'r',
--                                  per reader holder id -> hold count,
--                                  'x:<holder>' -> its lease end in server
--                                  ms, 'f:<holder>' -> its token)
-- KEYS[2]  the fence counter      (as in acquire.lua: expires a window after
--                                  the token it holds was issued)
-- KEYS[3]  the queue              (list of holder ids, oldest first)
-- KEYS[4]  the queue entries      (hash: holder id -> "<expiry ms>:<lease
--                                  ms>:<reserve>", with ":r" after it for a
--                                  reader)
--
-- ARGV[1] = 'acquire': ARGV[2] holder id, ARGV[3] lease ms, ARGV[4] '1' to
--           queue up when busy ('0': try once), ARGV[5] entry lifetime ms,
--           ARGV[6] release channel, ARGV[7] lease ms of a handoff (a short
--           claim that the new holder's watchdog extends: a waiter that died
--           just before its turn then blocks the key only that long),
--           ARGV[8] window ms (the counter's TTL), ARGV[9] tokens to reserve
--           for local holders (as in acquire.lua; kept in the queue entry
--           for a handoff; none for a reader), ARGV[10] 'r' for a read hold
--           (absent: a write hold)
--   returns {1, fence, upto}  held: it was free (or read-held, for a reader)
--                             and nobody alive was queued ahead (for a
--                             reader: no writer); fence+1..upto reserved
--           {2, fence, upto}  held: a release had handed it to this holder
--                             id (its lease is extended to the lease, never
--                             shortened)
--           {0, pttl}   busy (queued, or its entry refreshed, when ARGV[4] is '1')
-- ARGV[1] = 'release': ARGV[2] holder id, ARGV[3] release channel, ARGV[4]
--           window ms (the counter's TTL, for a handoff)
--   returns -1  not held (a queued holder id leaves the queue instead, and
--               readers it leaves first in line come in beside the readers
--               inside; a reader whose lease had passed)
--            0  freed: handed to the first live queued holder ("g <holder>
--               <fence> <upto>" on the channel, one per reader when readers
--               are first in line), or, with nobody queued, "1" on the
--               channel; or this reader left and other readers remain
--           >0  holds left
-- ARGV[1] = 'downgrade': ARGV[2] holder id, ARGV[3] release channel, ARGV[4]
--           window ms: the holder's write hold becomes a read hold in place
--           (its token and lease kept); readers first in line come in
--   returns  1  a read hold now (or one already)
--            0  not held by this holder id (nothing changed)
--
-- A queue entry lives until its expiry; a waiting process refreshes it by
-- calling 'acquire' again well before that. Entries of waiters that died or
-- gave up without a word are skipped when they reach the head. The lock is
-- handed over with the handoff lease of the waiter's entry. The queue and
-- its entries carry the TTL of the newest entry (each join or refresh sets
-- it), and an emptied queue is deleted: an abandoned queue leaves nothing.
--
-- Readers: when readers are first in line at a handoff, every reader queued
-- before the first writer comes in (READER_RUN per call; the rest at their
-- next attempt or refresh). A reader not at the head comes in while the key
-- is read-held when no live writer is queued ahead of it; a reader not queued
-- when no live writer is queued at all. A writer comes in as before: the
-- key free and nobody alive ahead of it. Readers whose lease has passed are
-- dropped before anything is decided (as read.lua does).
local lock, fences, queue, entries = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local op = ARGV[1]

-- The uncontended cases first, before the helpers below exist: making their
-- closures costs Redis about 2 µs a call, more than these paths' own work.
-- Each does exactly what the general path does in the same state, and
-- leaves every other state to it untouched.
if op == 'acquire' and redis.call('exists', lock, queue) == 0 then
  -- Free, nobody queued: a write hold as take_write makes it, or a read
  -- hold as take_read does (no tokens reserved for a reader).
  local t = redis.call('time')
  local clock = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local fence = tonumber(redis.call('get', fences) or '0') + 1
  if clock > fence then
    fence = clock
  end
  local token = string.format('%.0f', fence)
  if ARGV[10] == 'r' then
    redis.call('set', fences, token, 'px', ARGV[8])
    local ends = math.floor(clock / 1000) + tonumber(ARGV[3])
    redis.call('hset', lock, 'mode', 'r', ARGV[2], 1,
      'x:' .. ARGV[2], string.format('%.0f', ends), 'f:' .. ARGV[2], token)
    redis.call('pexpire', lock, ARGV[3])
    return {1, fence, fence}
  end
  local upto = fence + (tonumber(ARGV[9]) or 0)
  redis.call('set', fences, string.format('%.0f', upto), 'px', ARGV[8])
  redis.call('hset', lock, ARGV[2], 1, 'fence', token)
  redis.call('pexpire', lock, ARGV[3])
  return {1, fence, upto}
end
if op == 'release' then
  -- The last frame of a write hold, nobody queued: free, and said so.
  -- (HGETs, not HMGET: the commands an ACL user needs stay those listed.)
  if redis.call('hget', lock, ARGV[2]) == '1' and redis.call('hget', lock, 'mode') ~= 'r'
    and redis.call('exists', queue) == 0 then
    redis.call('del', lock)
    redis.call('publish', ARGV[3], '1')
    return 0
  end
end
local window = op == 'acquire' and ARGV[8] or ARGV[4]
local READER_RUN = 64

-- Server time, read once per call: µs and ms.
local clock_us = nil
local function now_us()
  if not clock_us then
    local t = redis.call('time')
    clock_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return clock_us
end
local function now_ms()
  return math.floor(now_us() / 1000)
end

-- The next fencing token, as in acquire.lua: max(counter + 1, server time in
-- µs); the counter keeps the last of the tokens reserved with it (`reserve`
-- more) for the window. Returns the token and the last one reserved.
local function next_token(reserve)
  local fence = tonumber(redis.call('get', fences) or '0') + 1
  if now_us() > fence then
    fence = now_us()
  end
  local upto = fence + (tonumber(reserve) or 0)
  redis.call('set', fences, string.format('%.0f', upto), 'px', window)
  return fence, upto
end

-- A write hold of the free key for `holder`.
local function take_write(holder, lease, reserve)
  local fence, upto = next_token(reserve)
  redis.call('hset', lock, holder, 1, 'fence', string.format('%.0f', fence))
  redis.call('pexpire', lock, lease)
  return fence, upto
end

-- A read hold for `holder`, beside the readers there may be; the hash lives
-- until the latest reader's lease end.
local function take_read(holder, lease)
  local fence = next_token(0)
  redis.call('hset', lock, 'mode', 'r', holder, 1,
    'x:' .. holder, string.format('%.0f', now_ms() + tonumber(lease)),
    'f:' .. holder, string.format('%.0f', fence))
  if redis.call('pttl', lock) < tonumber(lease) then
    redis.call('pexpire', lock, lease)
  end
  return fence
end

-- Drops the readers whose lease has passed: how many are left, and the
-- latest lease end among them.
local function prune()
  local fields = redis.call('hgetall', lock)
  local left, latest = 0, 0
  for i = 1, #fields, 2 do
    local name = fields[i]
    if string.sub(name, 1, 2) == 'x:' then
      local ends = tonumber(fields[i + 1])
      if ends <= now_ms() then
        local reader = string.sub(name, 3)
        redis.call('hdel', lock, reader, name, 'f:' .. reader)
      else
        left = left + 1
        if ends > latest then
          latest = ends
        end
      end
    end
  end
  return left, latest
end

-- The key's hold: 'w', 'r' (readers whose lease passed dropped first) or
-- nil (free; a read hash with no reader left is deleted).
local function hold()
  if redis.call('exists', lock) == 0 then
    return nil
  end
  if redis.call('hget', lock, 'mode') ~= 'r' then
    return 'w'
  end
  if prune() == 0 then
    redis.call('del', lock)
    return nil
  end
  return 'r'
end

-- A queue entry's expiry, lease, reserve and whether it is a reader's
-- (entries of an earlier version have no reserve and no mode).
local function parse(entry)
  local expiry, lease, reserve, mode = string.match(entry or '', '^(%d+):(%d+):?(%d*):?(r?)$')
  return tonumber(expiry), lease, reserve, mode == 'r'
end

-- The first queued holder whose entry is alive, its lease, its reserve and
-- whether it reads; dead heads are dropped on the way.
local function live_head()
  while true do
    local head = redis.call('lindex', queue, 0)
    if not head then
      return nil
    end
    local expiry, lease, reserve, read = parse(redis.call('hget', entries, head))
    if expiry and expiry > now_ms() then
      return head, lease, reserve, read
    end
    redis.call('lpop', queue)
    redis.call('hdel', entries, head)
  end
end

-- Whether a live writer is queued ahead of `holder` (anywhere in the queue,
-- for a holder id not queued).
local function writer_ahead(holder)
  for _, id in ipairs(redis.call('lrange', queue, 0, -1)) do
    if id == holder then
      return false
    end
    local expiry, _, _, read = parse(redis.call('hget', entries, id))
    if expiry and expiry > now_ms() and not read then
      return true
    end
  end
  return false
end

local function leave_queue(holder)
  if redis.call('hdel', entries, holder) == 1 then
    redis.call('lrem', queue, 1, holder)
  end
end

-- Gives the live head (from live_head) its hold and tells it.
local function grant(channel, head, lease, reserve, read)
  redis.call('lpop', queue)
  redis.call('hdel', entries, head)
  local fence, upto
  if read then
    fence = take_read(head, lease)
    upto = fence
  else
    fence, upto = take_write(head, lease, reserve)
  end
  redis.call('publish', channel, 'g ' .. head .. ' ' .. string.format('%.0f', fence)
    .. ' ' .. string.format('%.0f', upto))
end

-- While the key is read-held (or free): lets in the readers first in line,
-- up to the first writer.
local function admit_readers(channel)
  for _ = 1, READER_RUN do
    local head, lease, _, read = live_head()
    if not head or not read then
      return
    end
    grant(channel, head, lease, '0', true)
  end
end

-- Hands the free lock to the first live queued holder: a writer, or the
-- readers first in line; false when nobody is queued.
local function hand_over(channel)
  local head, lease, reserve, read = live_head()
  if not head then
    return false
  end
  grant(channel, head, lease, reserve, read)
  if read then
    admit_readers(channel)
  end
  return true
end

-- The hold handed to `holder` (by a release whose message has not reached
-- it, or that a sibling waiter of its process took already): extended to
-- `lease`, never shortened. Its {2, fence, upto}.
local function handed(holder, lease, read)
  if read then
    local ends = now_ms() + tonumber(lease)
    if tonumber(redis.call('hget', lock, 'x:' .. holder) or '0') < ends then
      redis.call('hset', lock, 'x:' .. holder, string.format('%.0f', ends))
    end
    if redis.call('pttl', lock) < tonumber(lease) then
      redis.call('pexpire', lock, lease)
    end
    local fence = tonumber(redis.call('hget', lock, 'f:' .. holder) or '0')
    return {2, fence, fence}
  end
  if redis.call('pttl', lock) < tonumber(lease) then
    redis.call('pexpire', lock, lease)
  end
  -- (A lock handed over by an earlier version has no 'fence' field.)
  local fence = tonumber(redis.call('hget', lock, 'fence') or redis.call('get', fences) or '0')
  -- The counter still ends the block reserved with the handoff (nobody
  -- else can take the lock while this holder has it); if it expired, no
  -- local holders.
  local upto = tonumber(redis.call('get', fences) or '0')
  if upto < fence then
    upto = fence
  end
  return {2, fence, upto}
end

if op == 'acquire' then
  local holder, lease, channel = ARGV[2], ARGV[3], ARGV[6]
  local read = ARGV[10] == 'r'
  -- Free first: the uncontended case then reads the hash once.
  local held = hold()
  if not held then
    local head = live_head()
    if not head or head == holder then
      if head then
        leave_queue(holder)
      end
      if read then
        local fence = take_read(holder, lease)
        return {1, fence, fence}
      end
      local fence, upto = take_write(holder, lease, ARGV[9])
      return {1, fence, upto}
    end
    -- Free (its holder's lease ran out, or a plain release): the first in
    -- line gets it (a reader among the readers first in line may be us).
    hand_over(channel)
    held = redis.call('hget', lock, 'mode') == 'r' and 'r' or 'w'
  end
  if redis.call('hexists', lock, holder) == 1 then
    if (held == 'r') ~= read then
      -- Never asked by this version: a place is used in one mode only.
      return redis.error_reply('fair.lua: ' .. holder .. ' holds the key in the other mode')
    end
    return handed(holder, lease, read)
  end
  if read and held == 'r' and not writer_ahead(holder) then
    leave_queue(holder)
    local fence = take_read(holder, lease)
    -- Readers it leaves first in line come in with it, not at their next
    -- refresh.
    admit_readers(channel)
    return {1, fence, fence}
  end
  if ARGV[4] == '1' then
    local life = tonumber(ARGV[5])
    local entry = string.format('%.0f', now_ms() + life) .. ':' .. ARGV[7] .. ':'
      .. (read and '0:r' or (ARGV[9] or '0'))
    if redis.call('hset', entries, holder, entry) == 1 then
      redis.call('rpush', queue, holder)
    end
    redis.call('pexpire', queue, life)
    redis.call('pexpire', entries, life)
  end
  return {0, redis.call('pttl', lock)}
end

if op == 'release' then
  local holder, channel = ARGV[2], ARGV[3]
  local holds = tonumber(redis.call('hget', lock, holder))
  if not holds then
    leave_queue(holder)
    -- A writer that gave up may leave readers first in line while the key
    -- is read-held: they come in now, not at their next refresh.
    if hold() == 'r' then
      admit_readers(channel)
    end
    return -1
  end
  if redis.call('hget', lock, 'mode') ~= 'r' then
    if holds > 1 then
      return redis.call('hincrby', lock, holder, -1)
    end
    redis.call('del', lock)
    if not hand_over(channel) then
      redis.call('publish', channel, '1')
    end
    return 0
  end
  -- A read hold: this reader's share had ended if its lease passed.
  local live = tonumber(redis.call('hget', lock, 'x:' .. holder) or '0') > now_ms()
  if live and holds > 1 then
    return redis.call('hincrby', lock, holder, -1)
  end
  redis.call('hdel', lock, holder, 'x:' .. holder, 'f:' .. holder)
  local left, latest = prune()
  if left == 0 then
    redis.call('del', lock)
    if not hand_over(channel) then
      redis.call('publish', channel, '1')
    end
  else
    -- Others read on: the hash lives until the latest of their lease ends;
    -- readers left first in line (past the run a handoff lets in) come in.
    redis.call('pexpire', lock, latest - now_ms())
    admit_readers(channel)
  end
  return live and 0 or -1
end

if op == 'downgrade' then
  local holder, channel = ARGV[2], ARGV[3]
  if not redis.call('hget', lock, holder) then
    return 0
  end
  if redis.call('hget', lock, 'mode') == 'r' then
    return 1
  end
  local pttl = redis.call('pttl', lock)
  if pttl < 0 then
    pttl = 0
  end
  local token = redis.call('hget', lock, 'fence') or '0'
  redis.call('hdel', lock, 'fence')
  redis.call('hset', lock, 'mode', 'r', 'x:' .. holder, string.format('%.0f', now_ms() + pttl),
    'f:' .. holder, token)
  -- Readers first in line come in; a writer first in line keeps every
  -- later reader out.
  admit_readers(channel)
  return 1
end

return redis.error_reply('fair.lua: unknown operation')
